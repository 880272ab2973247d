"""Jobs by the thousand: the filters of `tidal ls`, `tidal cancel` and `tidal preempt` (--state, --user, --name,
--tier, --since, --all), paging through ``GET /v1/jobs`` (never a silent cap: a notice when more jobs exist than
were shown), and cancelling or preempting several jobs at once through the bulk routes, with a confirmation for
more than a few."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import typer

from tidal.cli import listings, units
from tidal.cli.api import Client
from tidal.cli.formats import print_table
from tidal.cli.output import console, err_console, fail, plain_output
from tidal.errors import ValidationError, shown

#: Jobs one `tidal ls` shows unless told otherwise (the API's default page), and the most: the API's own
#: bounds (tidal.core.limits' MAX_PAGE and MAX_BULK; a unit test holds them equal), written here because
#: `tidal ls` does not import the core model.
PAGE = 1000
MAX_PAGE = 10_000
MAX_BULK = 1000
#: More jobs than this, given by id, are confirmed before anything is done to them (a filter's always are).
CONFIRM_OVER = 5
#: The states of a job not yet ended (tidal.core's JobState less TERMINAL; the same unit test holds them equal).
UNFINISHED = ["pending", "held", "running", "checkpointing", "preempted", "migrating", "resizing", "restoring"]
#: The jobs a confirmation shows before asking.
PREVIEW = 10


def state_option() -> Any:
    return typer.Option(None, "--state", metavar="STATE",
                        help="only jobs in this state (pending, running, held, …); repeatable, or a comma list")


def user_option() -> Any:
    return typer.Option(None, "--user", "-u", metavar="USER",
                        help="only this user's jobs (another user's: admin); repeatable, or a comma list")


def name_option() -> Any:
    return typer.Option(None, "--name", metavar="NAME",
                        help="only jobs of this name, or whose name matches this glob (* any characters, ? one: "
                             "'sweep-*'); case-sensitive")


def tier_option() -> Any:
    return typer.Option(None, "--tier", metavar="TIER", help="only jobs of this tier; repeatable, or a comma list")


def since_option() -> Any:
    return typer.Option(None, "--since", metavar="WHEN",
                        help="only jobs submitted since then: a time ago (90s, 30m, 1h, 2d) or a date and time "
                             "(2025-06-01T12:00, local time unless it gives an offset)")


def all_option() -> Any:
    return typer.Option(False, "--all", help="every user's jobs (an admin; anyone else is shown their own)")


def yes_option() -> Any:
    return typer.Option(False, "--yes", "-y", help="do not ask for a confirmation (needed without a terminal)")


def parse_since(text: str, now: float | None = None) -> float:
    """The Unix time ``--since`` stands for: a duration ago (``1h``), or a date and time (ISO 8601)."""
    try:
        return (time.time() if now is None else now) - units.parse_duration(text, "since")
    except ValidationError:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValidationError(f"--since: {shown(text)} is neither a time ago nor a date and time", field="since",
                              hint="e.g. --since 1h, --since 2d, --since 2025-06-01T12:00") from None


@dataclass(frozen=True)
class Selection:
    """The filter the options gave, as ``GET /v1/jobs``'s query."""

    states: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    name: str | None = None
    tiers: list[str] = field(default_factory=list)
    since: float | None = None
    all_users: bool = False

    @classmethod
    def given(cls, state: Sequence[str] | None, user: Sequence[str] | None, name: str | None,
              tier: Sequence[str] | None, since: str | None, all_users: bool) -> Selection:
        return cls(_split(state), _split(user), name, _split(tier),
                   None if since is None else parse_since(since), all_users)

    @property
    def empty(self) -> bool:
        return self == Selection()

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.states, "user": self.users, "tier": self.tiers, "name": self.name,
                               "since": self.since, "all": self.all_users or None}
        return {k: v for k, v in out.items() if v not in (None, [])}

    def words(self) -> str:
        """The filter in a few words, for a confirmation."""
        parts = [f"{k} {', '.join(v) if isinstance(v, list) else v}" for k, v in
                 (("state", self.states), ("user", self.users), ("name", self.name), ("tier", self.tiers)) if v]
        if self.since is not None:
            parts.append(f"submitted since {units.clock(self.since)}")
        if self.all_users:
            parts.append("every user's")
        return "; ".join(parts)


def from_options(state: Sequence[str] | None, user: Sequence[str] | None, name: str | None,
                 tier: Sequence[str] | None, since: str | None, all_users: bool) -> Selection:
    """The filter the options give; one the CLI cannot read (--since) is a usage error (exit status 2)."""
    try:
        return Selection.given(state, user, name, tier, since, all_users)
    except ValidationError as exc:
        fail(exc, code=2)


def _split(values: Sequence[str] | None) -> list[str]:
    return [v.strip() for g in values or () for v in g.split(",") if v.strip()]


@dataclass
class Listed:
    """What a listing got: the jobs, how many the filter selects in all, whether more are left, and whose jobs
    they are (the API's scope: own, users or all)."""

    jobs: list[dict[str, Any]]
    total: int
    more: bool
    scope: str


def pages(api: Client, params: dict[str, Any], size: int) -> Iterator[Listed]:
    """``GET /v1/jobs`` page by page (``more``: another page follows)."""
    cursor: str | None = None
    while True:
        r = api.request("GET", "/v1/jobs", params={**params, "limit": size, **({"cursor": cursor} if cursor else {})})
        cursor = r.headers.get("X-Tidal-Next-Cursor")
        jobs: list[dict[str, Any]] = r.json()
        yield Listed(jobs, int(r.headers.get("X-Tidal-Total-Count", len(jobs))), cursor is not None,
                     r.headers.get("X-Tidal-Scope", ""))
        if cursor is None:
            return


def fetch(api: Client, params: dict[str, Any], limit: int, all_pages: bool) -> Listed:
    """One page of ``limit`` jobs, or with ``all_pages`` every job, page after page."""
    out = Listed([], 0, False, "")
    for page in pages(api, params, limit):
        out.jobs += page.jobs
        out.total, out.more, out.scope = page.total, page.more, page.scope
        if not all_pages:
            break
    return out


def notices(listed: Listed, asked_all: bool) -> None:
    """On stderr: that more jobs exist than were shown, and that --all showed a user who is not an admin their
    own jobs only."""
    own_only(listed.scope, asked_all)
    if listed.more:
        note(f"showing {len(listed.jobs):,} of {listed.total:,} jobs: narrow with --state/--user/--name/--tier/"
             f"--since, or see more with --limit N or --all-pages")


def own_only(scope: str, asked_all: bool) -> None:
    """Where --all was given by a user who is not an admin: that these are their own jobs (on stderr)."""
    if asked_all and scope == "own":
        note("--all lists every user's jobs for an admin only: these are your own")


def note(text: str) -> None:
    """``note: TEXT`` on stderr, in colour on a terminal (rich is imported only there)."""
    if plain_output(sys.stderr):
        print(f"note: {text}", file=sys.stderr, flush=True)
        return
    from rich.text import Text

    err_console.print(Text.assemble(("note:", "yellow"), " ", text), highlight=False)


# -- several jobs at once -----------------------------------------------------------------------------------------
_OK = {"cancelled", "already_finished", "held", "preempting"}


def act(api: Client, verb: str, ids: Sequence[str], sel: Selection, yes: bool) -> int:
    """``verb`` (cancel, preempt) on the jobs given by id, or those ``sel`` selects (those not yet ended, unless
    it names states), once confirmed; prints each job's outcome and a summary. The exit status: 0, or 1 where a
    job was not found or its request was refused."""
    if ids:
        ids = list(dict.fromkeys(ids))
        if len(ids) > CONFIRM_OVER:
            _confirm(verb, len(ids), f"{verb} these {len(ids):,} jobs?", [], yes)
    else:
        params = sel.params() if sel.states else {**sel.params(), "state": UNFINISHED}
        listed = fetch(api, params, MAX_BULK, all_pages=True)
        own_only(listed.scope, sel.all_users)
        if not listed.jobs:
            note("no job matches: nothing to " + verb)
            return 0
        ids = [j["id"] for j in listed.jobs]
        _confirm(verb, len(ids), f"{verb} these {len(ids):,} jobs ({sel.words() or 'yours, not yet ended'})?",
                 listed.jobs, yes)
    results: list[dict[str, Any]] = []
    for start in range(0, len(ids), MAX_BULK):
        answer = api.post(f"/v1/jobs/{verb}", json={"ids": ids[start:start + MAX_BULK]})
        for r in answer["results"]:
            console.print(_text(r["message"], "" if r["outcome"] in _OK else "red"), highlight=False)
        results += answer["results"]
    if len(results) > 1:
        tally: dict[str, int] = {}
        for r in results:
            tally[r["outcome"]] = tally.get(r["outcome"], 0) + 1
        console.print(f"{len(results):,} jobs: " + ", ".join(f"{n:,} {o.replace('_', ' ')}" for o, n in tally.items()),
                      highlight=False)
    return 0 if all(r["outcome"] in _OK for r in results) else 1


def _confirm(verb: str, n: int, question: str, preview: list[dict[str, Any]], yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():  # nobody to ask: refuse rather than wait on a pipe or act unasked
        fail(ValidationError(f"{verb} {n:,} jobs? There is no terminal to confirm it on: nothing was done",
                             hint="give --yes to go ahead without a confirmation"), code=2)
    if preview:
        cols = [c for c in listings.JOBS.columns if c.header in ("ID", "NAME", "STATE", "SUBMITTED")]
        owner = next(c for c in listings.JOBS.columns if c.header == "OWNER")
        print_table(preview[:PREVIEW], [*cols[:2], owner, *cols[2:]])
        if len(preview) > PREVIEW:
            console.print(f"… and {len(preview) - PREVIEW:,} more", highlight=False)
    if not typer.confirm(question, default=False):
        note("nothing was done")
        raise typer.Exit(1)


def _text(text: str, style: str) -> Any:
    from rich.text import Text

    return Text(text, style=style)
