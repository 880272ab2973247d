"""Errors in the words the user typed: the API names the fields of its requests (``min_devices``, ``rank``); a
command says which flag (``--min-devices``) or job-file key each field came from, and the error is told in
those words, with what to do."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from tidal.errors import TidalError


def flag(field: str) -> str:
    """The flag that gives an API field: ``min_devices`` → ``--min-devices``."""
    return "--" + field.replace("_", "-")


def in_terms(exc: TidalError, names: Mapping[str, str], hint: str | None = None) -> TidalError:
    """``exc`` with each field of ``names`` called by its name there. A field with ``_`` in its name is replaced
    wherever it stands; a plain word (``rank``) only where the message begins with it, as a field's error does.
    ``hint``: what to do, where a rephrased error says nothing."""
    message = exc.message
    for field in sorted(names, key=len, reverse=True):
        if "_" in field:
            message = re.sub(rf"(?<![\w-]){re.escape(field)}\b", names[field], message)
        else:
            message = re.sub(rf"^{re.escape(field)}\b", names[field], message)
    if message == exc.message:
        return exc
    return type(exc)(message, hint=exc.hint or hint, **exc.fields)


@contextmanager
def phrased(names: Mapping[str, str], hint: str | None = None) -> Iterator[None]:
    """Errors raised in the block, in the user's terms (:func:`in_terms`)."""
    try:
        yield
    except TidalError as exc:
        raise in_terms(exc, names, hint) from None
