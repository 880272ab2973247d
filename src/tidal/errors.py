"""The one error root of Tidal.

Every error Tidal raises derives from :class:`TidalError`. Errors carry structured fields so that the
API can serialise them and the CLI can print them without a traceback: ``message`` says what went wrong,
``hint`` (optional) says what to do about it. Each class has one HTTP status (``status_code``): the API
answers an error with that status and :meth:`TidalError.to_dict` as the body.

A few classes also derive from a built-in exception, where a library's protocol needs one (pydantic turns
a ``ValueError`` raised by a validator into a validation error of the field).
"""

from __future__ import annotations

from typing import Any

#: How many characters of a value a caller sent an error message quotes back (:func:`shown`).
SHOWN_CHARS = 64


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A value a caller sent, as an error message quotes it: its ``repr``, of its first ``limit`` characters only,
    with ``…`` where it goes on, so that an error never echoes a huge input back (a 100 kB name, an unknown
    value); a lone surrogate (JSON allows one as an escape) is shown escaped. Every error that quotes input
    quotes it through here."""
    if isinstance(value, str):
        text = repr(value[:limit])
        if len(value) > limit:
            text = f"{text[:-1]}…{text[-1]}"
    else:
        text = repr(value)
        if len(text) > limit:
            text = text[:limit] + "…"
    return text.encode("utf-8", "backslashreplace").decode()


def named(name: str) -> str:
    """A name a caller gave (a job id, a variable's name), as a message names it: as it is where it is short and
    printable, else as :func:`shown` quotes it."""
    return name if name and name.isprintable() and len(name) <= SHOWN_CHARS else shown(name)


class TidalError(Exception):
    """Root of all Tidal errors."""

    #: HTTP status used when this error crosses the API.
    status_code: int = 500

    def __init__(self, message: str, *, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.fields: dict[str, Any] = fields

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint, **self.fields}


class ConfigError(TidalError):
    """A setting or an environment requirement is wrong or missing."""


class ValidationError(TidalError):
    """Bad input from a user (or a caller): ``field`` names what was wrong."""

    status_code = 422


class InvalidField(ValidationError, ValueError):
    """Bad input found by a pydantic validator. It is a ``ValueError`` so that pydantic reports it as a
    validation error of the field being validated (the API's 422 then names that field)."""


class NotFound(TidalError):
    status_code = 404


class Conflict(TidalError):
    """The request is valid but not in the current state (e.g. resizing a finished job)."""

    status_code = 409


class PayloadTooLarge(TidalError):
    """A request body over the route's limit; ``limit`` is that limit in bytes."""

    status_code = 413


class TooManyRequests(TidalError):
    """A caller over its request rate: ``retry_after`` says in how many seconds (whole, at least 1) a request will
    be taken again, ``rate`` and ``burst`` what the limit is (docs/cluster.md, Limits)."""

    status_code = 429


class Unauthorized(TidalError):
    status_code = 401


class Forbidden(TidalError):
    status_code = 403


class Unavailable(TidalError):
    """Something the control plane needs (its database) cannot be reached just now: the request was not
    carried out and may be tried again, unless ``in_doubt`` says that the connection was lost while the
    change was being committed (it may have been made: look before trying again)."""

    status_code = 503


class Unsupported(TidalError):
    """The kernel, CRIU build or platform lacks a feature that was asked for."""

    status_code = 501


class ProvisionError(TidalError):
    """CRIU (or another runtime requirement) could not be found or installed."""


class MechanismError(TidalError):
    """A launch, checkpoint or restore of a rank failed."""


class CheckpointError(MechanismError):
    """Taking, storing, verifying or restoring a checkpoint failed; ``object`` names the bad part."""


class CheckpointCorrupt(CheckpointError):
    """A committed checkpoint failed verification: one of its objects is missing from the store, cannot be
    decoded, or does not match its sha256. Unlike other restore failures this one does not go away by
    trying again. ``checkpoint`` names the store checkpoint, ``object`` the damaged file (or manifest),
    ``chunk`` the chunk's digest where one is to blame, ``reason`` what is wrong with it."""

    def __init__(self, message: str, *, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message, hint=hint or "restore an earlier checkpoint of the job: this one is damaged in "
                         "the store", **fields)


class RankExited(MechanismError):
    """The rank's process is gone (it exited, or was never started)."""


class StorageError(TidalError):
    """The checkpoint store could not read or write an object."""


class StoreUnreachable(StorageError):
    """A checkpoint store did not answer: its requests failed on the way (connection refused or dropped, timed
    out) or got 5xx answers, every try (``reason="unavailable"``). ``store`` names it. Unlike a missing or
    damaged chunk, this says nothing of the checkpoint: a restore that must copy it from that store may restore
    an older one held elsewhere instead."""


class ProtocolMismatch(ValidationError):
    """A message between the control plane and an agent is of a protocol version this side does not speak
    (``version``; ``accepted`` lists those it does)."""

    status_code = 426


class SimulationError(TidalError):
    """A simulation could not run to its end (its policy left jobs that nothing would ever start);
    ``policy`` names the policy, ``unfinished`` counts the jobs."""


class UndecodableChunk(StorageError):
    """A stored chunk object is not what its manifest says: truncated, or not decodable. ``reason`` is the
    short form (``truncated``, ``undecodable``, ``undecodable zstd frame``)."""


class LeaseLost(Conflict):
    """An agent no longer holds its node's lease (it expired, and the node may have been taken over): the
    agent must stop its ranks and register again. The control plane says so; the agent acts on it."""
