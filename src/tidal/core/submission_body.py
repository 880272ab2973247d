"""A job's submission as the API takes it and the CLI checks it before sending: :class:`JobSpec`'s submitted
fields as a pydantic model (see :meth:`JobSpec.submission_fields`), strict about its keys: an unknown one is
refused with the closest valid one suggested, rather than ignored (a typo would submit a job that was not
meant). Each value is then checked by :class:`JobSpec`, whose messages name the field and the bound."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from tidal.core.spec import JobSpec
from tidal.core.suggest import check_keys

#: The keys a submission may give, in order (a job file's keys are the same).
KEYS: tuple[str, ...] = tuple(f.name for f in JobSpec.submission_fields())


class _Submission(BaseModel):
    """A job's submission. Its fields are :class:`tidal.core.JobSpec`'s, made by :func:`_submission_model`."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # A Tidal error, not a ValueError: it reaches the API's handler as it is (422, its message and field).
        if isinstance(data, dict):
            check_keys(data, KEYS, "the job's submission")
        return data

    def to_spec(self, owner: str) -> JobSpec:
        return JobSpec.submitted(dict(self), owner=owner)


def _submission_model() -> type[_Submission]:
    fields: dict[str, Any] = {}
    for f in JobSpec.submission_fields():
        if f.required:
            fields[f.name] = (f.type, ...)
        elif f.default_factory is not None:
            fields[f.name] = (f.type, Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (f.type, f.default)
    return create_model("JobSubmit", __base__=_Submission, __module__=__name__, **fields)


if TYPE_CHECKING:
    JobSubmit = _Submission
else:
    JobSubmit = _submission_model()
