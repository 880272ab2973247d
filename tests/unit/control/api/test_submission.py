"""The API's submission body is made from JobSpec's fields: same names, order, types and defaults."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from tidal.control.api.schemas import JobSubmit
from tidal.core import JobSpec
from tidal.errors import ValidationError


def test_the_body_has_jobspecs_submitted_fields() -> None:
    fields = JobSpec.submission_fields()
    assert list(JobSubmit.model_fields) == [f.name for f in fields]
    for f in fields:
        info = JobSubmit.model_fields[f.name]
        assert info.annotation == f.type and info.is_required() == f.required
        if not f.required:
            assert info.get_default(call_default_factory=True) == (f.default_factory() if f.default_factory
                                                                   else f.default)


def first_error(body: Any) -> tuple[tuple[Any, ...], str]:
    with pytest.raises(pydantic.ValidationError) as e:
        JobSubmit.model_validate(body)
    err = e.value.errors()[0]
    return err["loc"], err["msg"]


def test_type_errors_read_as_before() -> None:
    ok = {"command": ["train"], "workdir": "/w"}
    assert first_error({**ok, "command": "train"}) == (("command",), "Input should be a valid list")
    assert first_error({**ok, "tier": 1}) == (("tier",), "Input should be a valid string")
    assert first_error({**ok, "env": []}) == (("env",), "Input should be a valid dictionary")
    assert first_error({**ok, "ranks": "many"})[0] == ("ranks",)
    assert first_error({"workdir": 5}) == (("command",), "Field required")
    assert JobSubmit.model_validate({**ok, "name": None}).to_spec("u").name == "train"


def test_unknown_keys_are_refused_with_the_closest_valid_one() -> None:
    ok = {"command": ["train"], "workdir": "/w"}
    with pytest.raises(ValidationError) as e:
        JobSubmit.model_validate({**ok, "rankz": 4})
    assert e.value.message == "unknown key 'rankz' in the job's submission: did you mean 'ranks'?"
    assert e.value.fields["field"] == "rankz" and e.value.hint is not None and "min_devices" in e.value.hint
    with pytest.raises(ValidationError) as e:
        JobSubmit.model_validate({**ok, "extra": 1})
    assert e.value.message == "unknown key 'extra' in the job's submission"
