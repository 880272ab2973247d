"""Per-user and per-project limits: what each is (the default, or an admin's override), what is used of it, and
its checks at submission.

A user has a request rate (requests/s and a burst: the API's rate limiter, :mod:`tidal.control.api.ratelimit`),
a most of jobs waiting (pending, held or preempted: a submission beyond is refused) and a most of devices held
(the scheduling policy keeps its jobs waiting beyond it: :func:`device_caps`). A project has the last two, over
all its members' jobs under it. The defaults are settings (``TIDAL_USER_RATE`` ..., :class:`Defaults`), which
the control plane puts in its transactions' ``Session.info`` (``"limits"``); an admin overrides them per user
(``users.limits``) and per project (``projects.limits``): a limit not there is the default, one set to None has
no limit."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from tidal.config import Settings
from tidal.control.store.models import JobRow, Project, User
from tidal.core import TERMINAL, JobState
from tidal.errors import Conflict, ValidationError

#: A user's limits, and a project's.
USER_LIMITS = ("rate", "burst", "max_queued", "max_devices")
PROJECT_LIMITS = ("max_queued", "max_devices")
#: The states of a waiting job: what a queued-jobs limit counts.
WAITING = (JobState.PENDING.value, JobState.HELD.value, JobState.PREEMPTED.value)
LIVE = tuple(st.value for st in JobState if st not in TERMINAL)
#: What an override may be set to (a bound far above any real need: a typo is refused, not stored).
MAX_RATE = 1_000_000.0
MAX_COUNT = 1_000_000_000
#: What an override may say instead of a number: no limit; or back to the default.
UNLIMITED = "unlimited"
RESET = ("default", "none")


@dataclass(frozen=True)
class Defaults:
    """The limits of a user (and a project) that an admin did not set; None: no limit."""

    user_rate: float | None = 50.0
    user_burst: int = 500
    admin_rate: float | None = 500.0
    admin_burst: int = 5000
    user_max_queued: int | None = 1000
    user_max_devices: int | None = None
    project_max_queued: int | None = None
    project_max_devices: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Defaults:
        """From the settings (``TIDAL_USER_RATE`` ...), where 0 means no limit."""
        def some(v: float) -> Any:
            return v or None

        return cls(user_rate=some(settings.user_rate), user_burst=max(1, settings.user_burst),
                   admin_rate=some(settings.admin_rate), admin_burst=max(1, settings.admin_burst),
                   user_max_queued=some(settings.user_max_queued), user_max_devices=some(settings.user_max_devices),
                   project_max_queued=some(settings.project_max_queued),
                   project_max_devices=some(settings.project_max_devices))


def defaults(s: Session) -> Defaults:
    """The defaults the control plane was started with (``Session.info["limits"]``; else the built-in ones)."""
    d = s.info.get("limits")
    return d if isinstance(d, Defaults) else Defaults()


@dataclass(frozen=True)
class Limit:
    value: float | None  # None: no limit
    source: str  # "user" or "project" (an admin's override), or "default"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


def _default(d: Defaults, role: str, name: str) -> float | None:
    if name in ("rate", "burst") and role == "admin":
        return d.admin_rate if name == "rate" else d.admin_burst
    return {"rate": d.user_rate, "burst": d.user_burst, "max_queued": d.user_max_queued,
            "max_devices": d.user_max_devices}[name]


def user_limits(s: Session, u: User) -> dict[str, Limit]:
    d = defaults(s)
    own = u.limits or {}
    return {n: Limit(own[n], "user") if n in own else Limit(_default(d, u.role, n), "default") for n in USER_LIMITS}


def project_limits(s: Session, p: Project) -> dict[str, Limit]:
    d = defaults(s)
    own = p.limits or {}
    dflt = {"max_queued": d.project_max_queued, "max_devices": d.project_max_devices}
    return {n: Limit(own[n], "project") if n in own else Limit(dflt[n], "default") for n in PROJECT_LIMITS}


def request_rate(s: Session, u: User) -> tuple[float | None, int]:
    """The user's request rate (requests/s; None: no limit) and burst."""
    lim = user_limits(s, u)
    burst = lim["burst"].value
    return lim["rate"].value, max(1, int(burst if burst is not None else MAX_COUNT))


def parse_changes(changes: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """An admin's changes, checked: limit → a number, ``"unlimited"`` (stored as None) or ``"default"``/``"none"``
    (the override removed: returned as the string ``"default"``)."""
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in allowed:
            raise ValidationError(f"unknown limit {name!r}", field=name, hint="one of " + ", ".join(allowed))
        if isinstance(value, str):
            word = value.strip().lower()
            if word == UNLIMITED:
                out[name] = None
            elif word in RESET:
                out[name] = "default"
            else:
                raise ValidationError(f"{name}: {value!r} is not a number, {UNLIMITED!r} or 'default'", field=name)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValidationError(f"{name}: {value!r} is not a number", field=name)
        if name == "rate":
            if not 0 < value <= MAX_RATE:
                raise ValidationError(f"rate: {value:g} requests/s; a rate is more than 0 and at most {MAX_RATE:g}",
                                      field=name, hint=f"or {UNLIMITED!r} for no limit")
            out[name] = float(value)
        else:
            least = 1 if name == "burst" else 0
            if value != int(value) or not least <= value <= MAX_COUNT:
                raise ValidationError(f"{name}: {value:g}; a whole number from {least} to {MAX_COUNT}", field=name,
                                      hint=f"or {UNLIMITED!r} for no limit")
            out[name] = int(value)
    return out


def apply(limits: dict[str, Any] | None, changes: dict[str, Any]) -> dict[str, Any]:
    """``limits`` with :func:`parse_changes`'s result applied (a new dict: the column is replaced, not changed
    in place)."""
    out = dict(limits or {})
    for name, value in changes.items():
        if value == "default":
            out.pop(name, None)
        else:
            out[name] = value
    return out


# -- what is used -------------------------------------------------------------------------------------------
#: A job's project, as the database reads it from the job's spec.
JOB_PROJECT: ColumnElement[str] = func.coalesce(JobRow.spec["project"].as_string(), "default")


def under(project: str) -> ColumnElement[bool]:
    """Jobs submitted under ``project``."""
    return JOB_PROJECT.in_((project,))


def queued(s: Session, owner: str) -> int:
    """The user's waiting jobs (by the jobs' index on owner and state)."""
    return int(s.scalar(select(func.count()).select_from(JobRow).where(
        JobRow.owner == owner, JobRow.state.in_(WAITING))) or 0)


def project_queued(s: Session, project: str) -> int:
    """The project's waiting jobs, every member's."""
    return int(s.scalar(select(func.count()).select_from(JobRow).where(
        JobRow.state.in_(WAITING), under(project))) or 0)


@dataclass
class Use:
    queued: int = 0
    devices: int = 0

    def to_json(self) -> dict[str, int]:
        return {"queued": self.queued, "devices": self.devices}


def use_by(s: Session, *, owner: str | None = None, project: str | None = None) -> tuple[dict[str, Use],
                                                                                         dict[str, Use]]:
    """What the live jobs use (waiting jobs, devices held), per owner and per project; only ``owner``'s or
    ``project``'s jobs where given. Live jobs are few (each user's waiting ones are bounded): one pass over
    them."""
    q = select(JobRow.owner, JOB_PROJECT, JobRow.state, JobRow.placement).where(JobRow.state.in_(LIVE))
    if owner is not None:
        q = q.where(JobRow.owner == owner)
    if project is not None:
        q = q.where(under(project))
    users: dict[str, Use] = {}
    projects: dict[str, Use] = {}
    for who, proj, state, placement in s.execute(q):
        devices = len({(p["node"], p["device"]) for p in placement or ()})
        for use in (users.setdefault(who, Use()), projects.setdefault(proj, Use())):
            use.queued += state in WAITING
            use.devices += devices
    return users, projects


# -- checks -------------------------------------------------------------------------------------------------
def admit(s: Session, u: User, project: Project) -> None:
    """At a submission: refuse it (:class:`Conflict`, nothing stored) where the user, or the project, has as many
    jobs waiting as it may."""
    most = user_limits(s, u)["max_queued"].value
    if most is not None:
        n = _counted(s, ("user", u.name), lambda: queued(s, u.name))
        if n >= most:
            raise Conflict(f"user {u.name} has {n} job(s) waiting (pending, held or preempted), the most it may "
                           f"have: submit again once some have started or ended", limit=int(most), queued=n,
                           user=u.name, hint=f"`tidal ls` lists them; an admin may raise the limit: `tidal user set "
                                             f"{u.name} --max-queued N`")
    most = project_limits(s, project)["max_queued"].value
    if most is not None:
        n = _counted(s, ("project", project.name), lambda: project_queued(s, project.name))
        if n >= most:
            raise Conflict(f"project {project.name} has {n} job(s) waiting (pending, held or preempted), the most it "
                           f"may have: submit again once some have started or ended", limit=int(most), queued=n,
                           project=project.name, hint=f"an admin may raise the limit: `tidal project set "
                                                      f"{project.name} --max-queued N`")


def admitted(s: Session, u: User, project: Project) -> None:
    """A job of ``u`` under ``project`` was stored waiting: the counts :func:`admit` took in this transaction
    count it (a batch of submissions counts each user's waiting jobs once, not once a submission)."""
    memo = s.info.get(_QUEUED)
    if memo:
        for key in (("user", u.name), ("project", project.name)):
            if key in memo:
                memo[key] += 1


_QUEUED = "queued_jobs"  # the transaction's counts of waiting jobs, in Session.info


def _counted(s: Session, key: tuple[str, str], count: Callable[[], int]) -> int:
    memo: dict[tuple[str, str], int] = s.info.setdefault(_QUEUED, {})
    if key not in memo:
        memo[key] = count()
    return memo[key]


def device_caps(s: Session) -> dict[str, int]:
    """Owner → the most devices their jobs may hold together, for each user that has a limit (an admin's
    override, else the default): what the scheduling policy keeps each user's jobs within."""
    d = defaults(s)
    out: dict[str, int] = {}
    for name, _role, limits in s.execute(select(User.name, User.role, User.limits).where(
            User.role.in_(("user", "admin")))):
        own = limits or {}
        cap = own.get("max_devices", d.user_max_devices)
        if cap is not None:
            out[name] = int(cap)
    return out


def project_device_caps(s: Session) -> dict[str, int]:
    """Project → the most devices its jobs may hold together, for each project that has a limit."""
    d = defaults(s)
    out: dict[str, int] = {}
    for name, limits in s.execute(select(Project.name, Project.limits)):
        own = limits or {}
        cap = own.get("max_devices", d.project_max_devices)
        if cap is not None:
            out[name] = int(cap)
    return out
