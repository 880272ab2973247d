"""User accounts, as an admin manages them: add (with the first token, and projects), list, show (with limits
and what the user uses of them), set limits, remove (refused while the user has unfinished jobs, unless forced:
then they are cancelled)."""

from __future__ import annotations

import pwd
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal.control import projects, requests, tokens, userlimits
from tidal.control.clock import now
from tidal.control.store.models import JobRow, ProjectMember, User, UserToken
from tidal.errors import Conflict, NotFound, ValidationError

#: Unfinished jobs named in a refusal to remove their user, at most.
SHOWN = 20


def get(s: Session, name: str) -> User:
    u = s.get(User, name)
    if u is None:
        raise NotFound(f"no user {name}", field="name", hint="`tidal user ls` lists them")
    return u


def add(s: Session, name: str, role: str, unix_user: str | None, *, allow_root: bool, projects_: list[str],
        by: str) -> tuple[User, str]:
    """A new user, its first token (shown once) and its projects (each must exist)."""
    if unix_user is not None:
        try:
            pwd.getpwnam(unix_user)
        except KeyError:
            raise ValidationError(f"no Unix account {unix_user!r}", field="unix_user",
                                  hint="give an account that exists on the nodes (and on this host)") from None
    for p in projects_:
        projects.get(s, p)
    token = tokens.create_user(s, name, role, unix_user, allow_root=allow_root, created_by=by)
    for p in dict.fromkeys(projects_):
        if p != projects.DEFAULT:
            projects.add_member(s, p, name)
    return get(s, name), token


def view(s: Session, u: User, refused: int | None = None) -> dict[str, Any]:
    """A user with their limits, and what they use of them: jobs waiting, devices held, and (``refused``) the
    requests the API refused over their rate."""
    mine, _ = userlimits.use_by(s, owner=u.name)
    use = mine.get(u.name, userlimits.Use())
    t = now(s)
    live = sum(1 for r in s.scalars(select(UserToken).where(UserToken.username == u.name))
               if tokens.token_state(r, t) == "active")
    return {"name": u.name, "role": u.role, "unix_user": u.unix_user, "created_at": u.created_at,
            "projects": projects.of_user(s, u.name) if u.role in ("user", "admin") else [],
            "tokens": live,
            "limits": {k: v.to_json() for k, v in userlimits.user_limits(s, u).items()},
            "usage": {**use.to_json(), "requests_refused": refused}}


def listing(s: Session) -> list[dict[str, Any]]:
    """Every account, by name, with its projects, tokens that work and what its jobs use (bounded queries: the
    users, their tokens, memberships and the live jobs)."""
    t = now(s)
    use, _ = userlimits.use_by(s)
    live: dict[str, int] = {}
    for r in s.scalars(select(UserToken).where(UserToken.revoked_at.is_(None))):
        if tokens.token_state(r, t) == "active":
            live[r.username] = live.get(r.username, 0) + 1
    member: dict[str, list[str]] = {}
    for project, name in s.execute(select(ProjectMember.project, ProjectMember.username)
                                   .order_by(ProjectMember.project)):
        member.setdefault(name, []).append(project)
    out = []
    for u in s.scalars(select(User).order_by(User.name)):
        people = u.role in ("user", "admin")
        out.append({"name": u.name, "role": u.role, "unix_user": u.unix_user, "created_at": u.created_at,
                    "projects": [projects.DEFAULT, *member.get(u.name, [])] if people else [],
                    "tokens": live.get(u.name, 0), "usage": use.get(u.name, userlimits.Use()).to_json()})
    return out


def set_limits(s: Session, name: str, changes: dict[str, Any]) -> User:
    u = get(s, name)
    u.limits = userlimits.apply(u.limits, userlimits.parse_changes(changes, userlimits.USER_LIMITS))
    return u


def remove(s: Session, name: str, *, by: str, force: bool) -> dict[str, Any]:
    """Remove a user, their tokens and memberships. Refused while they have unfinished jobs, unless ``force``:
    those are then cancelled. What was done: the jobs cancelled, the tokens that stopped working, the projects
    they left."""
    u = get(s, name)
    if u.role == "agent":
        raise Conflict(f"{name} is an agent credential, not a user", field="name",
                       hint=f"`tidal token revoke --node {name}` revokes a node's credential; `tidal node remove` "
                            "removes the node")
    if name == by:
        raise Conflict("you cannot remove yourself", field="name", hint="ask another admin")
    unfinished = list(s.scalars(select(JobRow).where(JobRow.owner == name, JobRow.state.in_(userlimits.LIVE))
                                .order_by(JobRow.seq)))
    if unfinished and not force:
        ids = [j.id for j in unfinished]
        shown = ", ".join(ids[:SHOWN]) + (", ..." if len(ids) > SHOWN else "")
        raise Conflict(f"user {name} has {len(ids)} unfinished job(s): {shown}", field="name",
                       jobs=ids[:SHOWN], unfinished=len(ids),
                       hint=f"cancel them first, or remove the user with --force, which cancels them (`tidal user rm "
                            f"{name} --force`)")
    cancelled = []
    for job in unfinished:
        requests.cancel(s, job, f"api:{by}:user-rm")
        cancelled.append(job.id)
    left = [p for p in projects.of_user(s, name) if p != projects.DEFAULT]
    revoked = tokens.remove_account(s, u)
    return {"name": name, "removed": True, "cancelled": cancelled, "tokens_revoked": revoked, "projects": left}
