"""A job's submission checked by the CLI before it is sent, with errors in the terms the user gave it: the
flag they typed (``--min-devices``) or the job file and key they wrote (``job.yaml: min_devices``), never a
field name of Tidal's own. A job file's unknown keys are refused, with the closest valid key suggested."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import pydantic

from tidal.core.submission_body import KEYS, JobSubmit
from tidal.core.suggest import check_keys
from tidal.errors import ValidationError

#: The option of `tidal submit` that gives each field of a job (``command`` is what follows ``--``).
FLAGS: Mapping[str, str] = {
    "name": "--name", "tier": "--tier", "project": "--project", "ranks": "--ranks",
    "min_devices": "--min-devices", "max_devices": "--max-devices", "checkpoint_every": "--checkpoint-every",
    "runtime": "--runtime",
    "max_restarts": "--max-restarts", "workdir": "--workdir", "region": "--region", "cluster": "--cluster",
}
# Where a message names a field: a field's name with an underscore anywhere (no English word has one); a
# plain one (ranks, tier, ...) at the start of the message or before its value in parentheses.
_SNAKE = "|".join(f for f in FLAGS if "_" in f)
_PLAIN = "|".join(f for f in FLAGS if "_" not in f)
_FIELD_WORD = re.compile(rf"(?<![\w-])({_SNAKE})(?![\w-])|^({_PLAIN})(?![\w-])|(?<![\w-])({_PLAIN})(?= \()")


def check_file_keys(doc: Mapping[Any, Any], file: str) -> None:
    """Refuse a job file's first unknown key: ``unknown key 'rankz' in job.yaml: did you mean 'ranks'?``."""
    check_keys(doc, KEYS, file)


def check(body: Mapping[str, Any]) -> None:
    """Check the request's body as the API will (its types, then :class:`~tidal.core.JobSpec`'s bounds)."""
    try:
        JobSubmit.model_validate(dict(body)).to_spec(owner="-")
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else None
        raise ValidationError(f"{field}: {err['msg']}" if field else str(err["msg"]), field=field) from None


def in_user_terms(exc: ValidationError, from_file: Collection[str], file: str | None) -> ValidationError:
    """``exc`` about a field of the job, reworded to name what the user typed: each field by its key where the
    job file gave it (and the message placed in that file), else by its flag."""
    field = exc.fields.get("field")
    if field not in FLAGS and field not in from_file:
        return exc  # not about one of the job's fields (the file itself, an unknown key, ...)

    def term(name: str) -> str:
        return name if name in from_file or name not in FLAGS else FLAGS[name]

    message = _FIELD_WORD.sub(lambda m: term(m.group(m.lastindex or 0)), exc.message)
    own = term(str(field))
    named = re.search(rf"(?<![\w-]){re.escape(own)}(?![\w-])", message) is not None
    if field in from_file and file is not None:
        message = f"{file}: " + ("" if named else f"{own}: ") + message
    elif not named:
        message = f"{own}: {message}"
    return ValidationError(message, hint=exc.hint, **exc.fields)
