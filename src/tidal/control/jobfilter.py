"""Which jobs a listing or a bulk request selects: a filter (states, owners, a name or a glob of names, tiers,
submitted since), whose jobs the caller may select, and a keyset cursor over the submission sequence.

Jobs are listed newest first, by ``(seq, id)`` descending (``seq``: the submission number; ``id`` breaks a tie
two concurrent submissions could make). A cursor is the key of the last job a page held, and the next page
holds the jobs after it: a job submitted while a client pages through comes before the first page, and so
neither shifts the pages nor is seen twice; each job is on exactly one page."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import Session

from tidal.control.store.models import JobRow
from tidal.core import TERMINAL, JobState, Tier, limits
from tidal.core.suggest import did_you_mean
from tidal.errors import Forbidden, ValidationError, shown

STATES = tuple(s.value for s in JobState)
#: The states of a job not yet ended: what a bulk request's filter selects where it names no state.
UNFINISHED = tuple(s.value for s in JobState if s not in TERMINAL)
#: The most values one filter may give for a field (states, users, tiers).
MAX_VALUES = 64
#: The most jobs one bulk request acts on (its ids, or a filter's page).
MAX_BULK = limits.MAX_BULK


@dataclass(frozen=True)
class Filter:
    """What selects jobs; every field is optional (None: any). ``owners`` None: every user's."""

    owners: tuple[str, ...] | None = None
    states: tuple[str, ...] | None = None
    name: str | None = None
    tiers: tuple[str, ...] | None = None
    since: float | None = None

    def where(self, dialect: str) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        if self.owners is not None:
            out.append(JobRow.owner.in_(self.owners))
        if self.states is not None:
            out.append(JobRow.state.in_(self.states))
        if self.tiers is not None:
            out.append(JobRow.tier.in_(self.tiers))
        if self.since is not None:
            out.append(JobRow.submitted_at >= self.since)
        if self.name is not None:
            out.append(name_matches(self.name, dialect))
        return out


def values(given: Iterable[str] | None, field: str) -> list[str] | None:
    """A field's values as given: repeated, or comma lists (``state=pending,held``), without blanks; None
    when none was given."""
    if given is None:
        return None
    out = [v.strip() for g in given for v in g.split(",") if v.strip()]
    if len(out) > MAX_VALUES:
        raise ValidationError(f"{field}: {len(out)} values, more than {MAX_VALUES}", field=field)
    return out or None


def states(given: Sequence[str] | None) -> tuple[str, ...] | None:
    if given is None:
        return None
    for v in given:
        if v.lower() not in STATES:
            raise ValidationError(f"state: unknown state {shown(v)}{did_you_mean(v[:64], STATES)}", field="state",
                                  hint="the states: " + ", ".join(STATES))
    return tuple(sorted({v.lower() for v in given}))


def tiers(given: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if given is None else tuple(sorted({Tier.parse(v).value for v in given}))


def name_pattern(name: str | None) -> str | None:
    if name is None:
        return None
    if not name:
        raise ValidationError("name: give a job's name, or a glob of names (sweep-*)", field="name")
    if len(name) > limits.MAX_NAME_CHARS:
        raise ValidationError(f"name: {shown(name)} is {len(name)} characters, over {limits.MAX_NAME_CHARS}",
                              field="name")
    return name


def name_matches(pattern: str, dialect: str) -> ColumnElement[bool]:
    """Names equal to ``pattern``, or, where it holds ``*`` (any characters) or ``?`` (one), matching it as a
    shell glob; case-sensitive on every database (SQLite's GLOB; elsewhere LIKE with ``%``, ``_`` and ``\\``
    escaped)."""
    if "*" not in pattern and "?" not in pattern:
        return JobRow.name == pattern
    if dialect == "sqlite":
        return JobRow.name.op("GLOB")(pattern.replace("[", "[[]"))
    like = re.sub(r"([\\%_])", r"\\\1", pattern).replace("*", "%").replace("?", "_")
    return JobRow.name.like(like, escape="\\")


def owners(caller: str, admin: bool, users: Sequence[str] | None, all_users: bool) -> tuple[tuple[str, ...] | None,
                                                                                          str]:
    """Whose jobs the caller selects, and the scope that is (``own``, ``users`` or ``all``): the users it names
    (an admin may name anyone; anyone else only themselves: 403), else every user's for an admin who asks for
    all (``all_users``; anyone else gets their own), else their own."""
    if users:
        for u in users:
            if len(u) > limits.MAX_ID_CHARS:
                raise ValidationError(f"user: {shown(u)} is not a user name (at most {limits.MAX_ID_CHARS} "
                                      "characters)", field="user")
        others = sorted({u for u in users if u != caller})
        if others and not admin:
            raise Forbidden(f"user: {caller} may list and act on their own jobs only, not those of "
                            f"{shown(others[0])}", field="user",
                            hint="only an admin may name another user; leave out --user for your own jobs")
        return tuple(sorted(set(users))), "own" if not others else "users"
    if all_users and admin:
        return None, "all"
    return (caller,), "own"


# -- the cursor ---------------------------------------------------------------------------------------------------
_CURSOR = re.compile(r"(\d{1,18})\.([A-Za-z0-9_-]{1,32})")


def cursor_of(job: JobRow) -> str:
    return f"{job.seq}.{job.id}"


def parse_cursor(text: str | None) -> tuple[int, str] | None:
    if text is None:
        return None
    m = _CURSOR.fullmatch(text)
    if not m:
        raise ValidationError(f"cursor: {shown(text)} is not a cursor this API gave", field="cursor",
                              hint="give the X-Tidal-Next-Cursor of the previous page as it is")
    return int(m.group(1)), m.group(2)


def _after(key: tuple[int, str]) -> ColumnElement[bool]:
    seq, jid = key
    return or_(JobRow.seq < seq, and_(JobRow.seq == seq, JobRow.id < jid))


@dataclass(frozen=True)
class Page:
    jobs: list[JobRow]
    next_cursor: str | None  # None: this was the last page


def query(f: Filter, dialect: str) -> Select[Any]:
    return select(JobRow).where(*f.where(dialect))


def page(s: Session, f: Filter, cursor: str | None, limit: int) -> Page:
    """Up to ``limit`` jobs of ``f`` after ``cursor`` (None: from the newest), newest first."""
    key = parse_cursor(cursor)
    q = query(f, _dialect(s))
    if key is not None:
        q = q.where(_after(key))
    rows = list(s.scalars(q.order_by(JobRow.seq.desc(), JobRow.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, cursor_of(rows[-1]) if more and rows else None)


def count(s: Session, f: Filter) -> int:
    """How many jobs ``f`` selects, on every page."""
    return int(s.scalar(select(func.count()).select_from(JobRow).where(*f.where(_dialect(s)))) or 0)


def _dialect(s: Session) -> str:
    return s.get_bind().dialect.name
