"""What a user most likely meant by a word Tidal does not know: the closest valid one (difflib), for error
messages such as "unknown key 'rankz' in job.yaml: did you mean 'ranks'?"."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from tidal.errors import SHOWN_CHARS, ValidationError, named, shown


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The valid word nearest to ``word``, if one is near enough to be a likely typo."""
    found = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``": did you mean 'x'?"`` for the closest valid word, or nothing."""
    best = closest(word, choices)
    return f": did you mean {best!r}?" if best is not None else ""


def check_keys(doc: Mapping[Any, Any], valid: Iterable[str], where: str) -> None:
    """Refuse the first key of ``doc`` that is not ``valid``, naming ``where`` it was (e.g. ``job.yaml``)."""
    keys = list(valid)
    for key in doc:
        if key not in keys:
            name = str(key)
            raise ValidationError(f"unknown key {shown(name)} in {where}{did_you_mean(name[:SHOWN_CHARS], keys)}",
                                  field=named(name), hint="valid keys: " + ", ".join(keys))
