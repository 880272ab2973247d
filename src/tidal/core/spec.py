"""What a user asks for: the job's specification (never changed by scheduling).

:class:`JobSpec` is the one model of a job's specification, from the CLI and job files through the API and
the database to the agent: the API's submission body is derived from its fields (see
:meth:`JobSpec.submission_fields`), the database holds :meth:`JobSpec.to_json` and the control plane reads
it back with :meth:`JobSpec.from_json`. A new field of a job is a new field here, plus its use.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from tidal.core import limits
from tidal.core.jobname import default_name
from tidal.core.tiers import Tier
from tidal.errors import ValidationError, named, shown

# Tidal's own settings (pydantic-settings reads them case-insensitively) and credentials: a job's
# environment never carries them, so a job can neither impersonate its submitter nor steer Tidal's code
# that runs inside its ranks.
RESERVED_ENV_PREFIX = "TIDAL_"

# Names of regions and clusters, as agents give them (tidal.core.protocol's).
_PLACE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# Field metadata: how a submission (the API's request body, which the CLI and job files fill) gives a field
# where that is not as the spec holds it.
_SUBMITTED = "submitted"
_SET_BY_CONTROL_PLANE = "set by the control plane"  # no submitter gives it


@dataclasses.dataclass(frozen=True)
class SubmittedField:
    """A field of a job's submission: its name, its type in the request body, and its default there
    (``required``: none; ``default_factory``: a fresh default per submission)."""

    name: str
    type: Any
    default: Any = None
    default_factory: Callable[[], Any] | None = None
    required: bool = False


def _submitted_as(type_: Any, default: Any = dataclasses.MISSING) -> dict[str, Any]:
    return {_SUBMITTED: (type_, default)}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """A job of ``ranks`` (W) ranks; it may run on ``min_devices..max_devices`` devices (1 ≤ min ≤ max ≤ W).

    The fields are in the order a submission is checked in; they are keyword-only."""

    command: tuple[str, ...] = dataclasses.field(metadata=_submitted_as(list[str]))
    workdir: str
    # Empty: named for what it runs (tidal.core.jobname: ``python train.py`` is ``train``).
    name: str = dataclasses.field(default="", metadata=_submitted_as(str | None, None))
    tier: Tier = dataclasses.field(default=Tier.BASIC, metadata=_submitted_as(str, Tier.BASIC.value))
    # None in a submission: left out, a single process that sees the environment plain ``python`` would
    # (no RANK, WORLD_SIZE, MASTER_*); given, even 1: torchrun's (``distributed``).
    ranks: int = dataclasses.field(default=1, metadata=_submitted_as(int | None, None))
    min_devices: int | None = None  # None: 1
    max_devices: int | None = None  # None: ranks
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, metadata=_submitted_as(dict[str, str]))
    checkpoint_every: float | None = None
    # Expected run time at full size, seconds (tidal submit --runtime): what admission against the load
    # weighs a guaranteed job's SLA by (TIDAL_ADMIT_SLA); without it the job is admitted as asked.
    runtime: float | None = None
    max_restarts: int = 3
    project: str = "default"
    region: str | None = None  # pinned to this region's clusters (tidal submit --region)
    cluster: str | None = None  # pinned to this cluster (tidal submit --cluster)
    owner: str = dataclasses.field(default="", metadata={_SUBMITTED: _SET_BY_CONTROL_PLANE})
    # The submission gave ranks (or ranks > 1): the ranks get torchrun's environment.
    distributed: bool = dataclasses.field(default=False, metadata={_SUBMITTED: _SET_BY_CONTROL_PLANE})

    @property
    def torchrun(self) -> bool:
        """Whether the ranks see torchrun's environment: a job submitted with ``ranks``, and every job of
        several ranks (as stored before ``distributed`` was)."""
        return self.distributed or self.ranks > 1

    def __post_init__(self) -> None:
        # Normalise first (frozen: via object.__setattr__), then validate, so a JobSpec is always valid.
        self._normalise()
        self.validate()

    def _normalise(self) -> None:
        set_ = object.__setattr__
        set_(self, "command", tuple(self.command))
        set_(self, "env", MappingProxyType(dict(self.env)))
        if isinstance(self.tier, str):
            set_(self, "tier", Tier.parse(self.tier))
        if not self.name:
            argv = self.command if all(isinstance(a, str) for a in self.command) else ()
            set_(self, "name", default_name(argv, limits.MAX_NAME_CHARS))
        if self.min_devices is None:
            set_(self, "min_devices", 1)
        if self.max_devices is None:
            set_(self, "max_devices", self.ranks)

    # -- the database's form ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The spec as the database's JSON column holds it: every field, as JSON (lists, objects, strings)."""
        return {f.name: _json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> JobSpec:
        """The spec of a stored job (:meth:`to_json`'s form), as this or an older version wrote it: a field
        it lacks, or holds as null, takes its default; keys it does not know are left out. It is normalised
        but not validated again: a job stays readable after a limit is tightened."""
        spec = object.__new__(cls)
        for f in dataclasses.fields(cls):
            value = doc.get(f.name)
            if value is None:
                if f.default_factory is not dataclasses.MISSING:
                    value = f.default_factory()
                elif f.default is not dataclasses.MISSING:
                    value = f.default
                else:
                    raise ValidationError(f"the stored job spec has no {f.name}", field=f.name,
                                          hint="the job's row in the database is damaged")
            object.__setattr__(spec, f.name, value)
        spec._normalise()
        return spec

    # -- the submission's form ----------------------------------------------------------------------------
    @classmethod
    def submission_fields(cls) -> list[SubmittedField]:
        """The fields a submission gives, in order, with their types and defaults in the request body (the
        API's body model is made from these)."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):
            how = f.metadata.get(_SUBMITTED)
            if how == _SET_BY_CONTROL_PLANE:
                continue
            type_, default = how if how is not None else (hints[f.name], dataclasses.MISSING)
            if default is dataclasses.MISSING:
                default = f.default
            factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
            out.append(SubmittedField(f.name, type_, None if default is dataclasses.MISSING else default,
                                      factory, required=default is dataclasses.MISSING and factory is None))
        return out

    @classmethod
    def submitted(cls, values: Mapping[str, Any], *, owner: str) -> JobSpec:
        """The spec of a submission by ``owner``: ``values`` by field name, as :meth:`submission_fields`
        gives them (a null takes the spec's default)."""
        return cls(**{k: v for k, v in values.items() if v is not None}, owner=owner,
                   distributed=values.get("ranks") is not None)

    def validate(self) -> None:
        # The command first: a job's name defaults to its program's.
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ValidationError("command must be a non-empty list of non-empty strings", field="command")
        _command(self.command)
        if not self.name or not self.name.strip():
            raise ValidationError("job name must not be empty", field="name")
        _text(self.name, "name", max_chars=limits.MAX_NAME_CHARS)
        _text(self.workdir, "workdir", max_bytes=limits.MAX_WORKDIR_BYTES)
        if not self.workdir.startswith("/"):
            raise ValidationError(f"workdir must be absolute, got {shown(self.workdir)}", field="workdir")
        if not isinstance(self.ranks, int) or not 1 <= self.ranks <= limits.MAX_RANKS:
            raise ValidationError(f"ranks must be an integer from 1 to {limits.MAX_RANKS}, got {shown(self.ranks)}",
                                  field="ranks")
        lo, hi = self.min_devices, self.max_devices
        assert lo is not None and hi is not None
        if lo < 1:
            raise ValidationError(f"min_devices must be ≥ 1, got {lo}", field="min_devices")
        if hi > self.ranks:
            raise ValidationError(
                f"max_devices ({hi}) must be ≤ ranks ({self.ranks})", field="max_devices"
            )
        if lo > hi:
            raise ValidationError(
                f"min_devices ({lo}) must be ≤ max_devices ({hi})", field="min_devices"
            )
        every = self.checkpoint_every
        if every is not None and not 0 < every <= limits.MAX_CHECKPOINT_EVERY_S:
            raise ValidationError(
                f"checkpoint_every must be > 0 and ≤ {limits.MAX_CHECKPOINT_EVERY_S:.0f} seconds, got {every}",
                field="checkpoint_every", hint="leave it out for no periodic checkpoints")
        runtime = self.runtime
        if runtime is not None and not 0 < runtime <= limits.MAX_RUNTIME_S:
            raise ValidationError(f"runtime must be > 0 and ≤ {limits.MAX_RUNTIME_S:.0f} seconds, got {runtime}",
                                  field="runtime", hint="the job's expected run time, e.g. 2h; or leave it out")
        if not 0 <= self.max_restarts <= limits.MAX_RESTARTS:
            raise ValidationError(f"max_restarts must be from 0 to {limits.MAX_RESTARTS}, got {self.max_restarts}",
                                  field="max_restarts")
        validate_env(self.env)
        if not self.project:
            raise ValidationError("project must not be empty", field="project")
        _text(self.project, "project", max_chars=limits.MAX_PROJECT_CHARS)
        for field in ("region", "cluster"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str) and _PLACE_NAME.match(value)
                                          and len(value) <= limits.MAX_ID_CHARS):
                raise ValidationError(f"{field} {shown(value)} is not a {field} name (letters, digits, '.', '_', '-', "
                                      f"at most {limits.MAX_ID_CHARS} characters)", field=field,
                                      hint=f"`tidal nodes` lists each node's {field}")

    @property
    def elastic(self) -> bool:
        return self.min_devices != self.max_devices


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def validate_env(env: Mapping[str, str]) -> None:
    """A job's environment: names and values the kernel can pass to exec, within the limits, and none of
    Tidal's own variables. ``LD_PRELOAD``, ``LD_LIBRARY_PATH`` and the like are allowed: the job's
    environment is applied only in the rank's command, which already runs as the job's owner, where they
    can do no more than the owner setting them in their own shell."""
    if len(env) > limits.MAX_ENV_VARS:
        raise ValidationError(f"env: {len(env)} variables, more than the {limits.MAX_ENV_VARS} a job may have",
                              field="env")
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValidationError(f"env: {shown(name)}: names and values must be strings", field="env")
        label = named(name)
        if not name or "=" in name or "\0" in name:
            raise ValidationError(f"env: {label} is not a variable name (non-empty, without '=' or NUL)",
                                  field="env", variable=label)
        if name.upper().startswith(RESERVED_ENV_PREFIX):
            raise ValidationError(
                f"env: {label}: variables beginning with {RESERVED_ENV_PREFIX} are Tidal's own settings and "
                "credentials and cannot be set for a job", field="env", variable=label,
                hint=f"remove {label} from the job's environment")
        size = _utf8(name, "env", f"env: {label}: the name")
        if size > limits.MAX_ENV_NAME_BYTES:
            raise ValidationError(f"env: {label}: the name is over {limits.MAX_ENV_NAME_BYTES} bytes",
                                  field="env", variable=label)
        if "\0" in value:
            raise ValidationError(f"env: {label}: the value holds a NUL character", field="env", variable=label)
        vsize = _utf8(value, "env", f"env: {label}: the value")
        if vsize > limits.MAX_ENV_VALUE_BYTES:
            raise ValidationError(f"env: {label}: the value is {vsize} bytes, over {limits.MAX_ENV_VALUE_BYTES}",
                                  field="env", variable=label)
        total += size + vsize + 2
    if total > limits.MAX_ENV_BYTES:
        raise ValidationError(f"env: {total} bytes in all, over {limits.MAX_ENV_BYTES}", field="env",
                              hint="pass large settings in a file in the working directory")


def _command(argv: tuple[str, ...]) -> None:
    if len(argv) > limits.MAX_COMMAND_ARGS:
        raise ValidationError(f"command: {len(argv)} arguments, more than {limits.MAX_COMMAND_ARGS}",
                              field="command")
    total = 0
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise ValidationError(f"command: argument {i} holds a NUL character", field="command")
        size = _utf8(arg, "command", f"command: argument {i}")
        if size > limits.MAX_ARG_BYTES:
            raise ValidationError(f"command: argument {i} is {size} bytes, over {limits.MAX_ARG_BYTES}",
                                  field="command")
        total += size + 1
    if total > limits.MAX_COMMAND_BYTES:
        raise ValidationError(f"command: {total} bytes in all, over {limits.MAX_COMMAND_BYTES}", field="command",
                              hint="put long arguments in a file or a script")


def _text(value: str, field: str, *, max_chars: int | None = None, max_bytes: int | None = None) -> None:
    """Text that can be stored and shown: valid Unicode without NUL, within its length."""
    if "\0" in value:
        raise ValidationError(f"{field} holds a NUL character", field=field)
    size = _utf8(value, field, field)
    if max_chars is not None and len(value) > max_chars:
        raise ValidationError(f"{field} is {len(value)} characters, over {max_chars}", field=field)
    if max_bytes is not None and size > max_bytes:
        raise ValidationError(f"{field} is {size} bytes, over {max_bytes}", field=field)


def _utf8(value: str, field: str, what: str) -> int:
    """Its size in UTF-8; a lone surrogate (JSON allows one as an escape) has no UTF-8 form."""
    try:
        return len(value.encode())
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{what} is not valid Unicode text (a lone surrogate at character {exc.start})",
                              field=field) from None
