"""Projects and their members: a user may submit only under a project they belong to; ``default`` is open to
every user; an admin may submit under any project there is. Admins make and remove projects and members."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from tidal.control import userlimits
from tidal.control.clock import now
from tidal.control.store.models import JobRow, Project, ProjectMember, User
from tidal.core import limits
from tidal.errors import Conflict, Forbidden, NotFound, ValidationError

DEFAULT = "default"
NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.MAX_PROJECT_CHARS - 1}}}")
NAME_RULE = (f"letters, digits, '-', '_' and '.', starting with a letter or digit, at most "
             f"{limits.MAX_PROJECT_CHARS} characters")
#: Projects named in an error message, at most (a user may be in many).
SHOWN = 20


def check_name(name: str, field: str = "project") -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValidationError(f"bad project name {name!r}: {NAME_RULE}", field=field, hint="e.g. vision, team-a.2026")


def get(s: Session, name: str) -> Project:
    check_name(name)
    p = s.get(Project, name)
    if p is None:
        raise NotFound(f"no project {name}", field="project", hint="`tidal project ls` lists them")
    return p


def _user(s: Session, name: str) -> User:
    u = s.get(User, name)
    if u is None:
        raise NotFound(f"no user {name}", field="user", hint="`tidal user ls` lists them")
    if u.role not in ("user", "admin"):
        raise ValidationError(f"{name} is a {u.role} account: only users and admins submit jobs", field="user")
    return u


def add(s: Session, name: str, created_by: str, members: list[str] | tuple[str, ...] = ()) -> Project:
    check_name(name, "name")
    if s.get(Project, name) is not None:
        raise Conflict(f"project {name} exists", field="name", hint=f"`tidal project show {name}`")
    p = Project(name=name, created_at=now(s), created_by=created_by, limits={})
    s.add(p)
    s.flush()
    for user in dict.fromkeys(members):
        add_member(s, name, user)
    return p


def remove(s: Session, name: str) -> dict[str, Any]:
    """Remove a project and its memberships; refused for ``default``, and while jobs under it are unfinished."""
    p = get(s, name)
    if name == DEFAULT:
        raise Conflict("project default is every user's: it cannot be removed", field="project")
    live = list(s.scalars(select(JobRow.id).where(JobRow.state.in_(userlimits.LIVE),
                                                  userlimits.under(name))
                          .limit(SHOWN + 1)))
    if live:
        shown = ", ".join(live[:SHOWN]) + (", ..." if len(live) > SHOWN else "")
        raise Conflict(f"project {name} has unfinished jobs: {shown}", field="project",
                       hint="remove it once they have ended (cancel them: `tidal cancel JOB`)")
    n = len(members(s, name))
    s.execute(delete(ProjectMember).where(ProjectMember.project == name))
    s.delete(p)
    return {"name": name, "removed": True, "members": n}


def members(s: Session, project: str) -> list[str]:
    return list(s.scalars(select(ProjectMember.username).where(ProjectMember.project == project)
                          .order_by(ProjectMember.username)))


def add_member(s: Session, project: str, user: str) -> bool:
    """Whether ``user`` was added (False: it was a member already)."""
    get(s, project)
    if project == DEFAULT:
        raise Conflict("project default is open to every user: it has no members to add", field="project")
    _user(s, user)
    if s.get(ProjectMember, (project, user)) is not None:
        return False
    s.add(ProjectMember(project=project, username=user, added_at=now(s)))
    return True


def remove_member(s: Session, project: str, user: str) -> None:
    get(s, project)
    row = s.get(ProjectMember, (project, user))
    if row is None:
        raise NotFound(f"user {user} is not a member of project {project}", field="user",
                       hint=f"`tidal project show {project}` lists its members")
    s.delete(row)


def of_user(s: Session, user: str) -> list[str]:
    """The projects ``user`` belongs to: ``default``, then theirs by name."""
    return [DEFAULT, *s.scalars(select(ProjectMember.project).where(ProjectMember.username == user)
                                .order_by(ProjectMember.project))]


def _shown(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def for_submission(s: Session, u: User, project: str) -> Project:
    """The project a job of ``u`` is submitted under, where ``u`` may submit under it; else a clear refusal
    naming the user's projects (422 for a bad or unknown name, 403 for a project the user is not in)."""
    check_name(project)
    p = s.get(Project, project)
    if p is not None and (project == DEFAULT or u.role == "admin"
                          or s.get(ProjectMember, (project, u.name)) is not None):
        return p
    mine = of_user(s, u.name)
    hint = ("an admin may submit under any project there is: `tidal project ls`" if u.role == "admin" else
            f"your projects: {_shown(mine)}; an admin adds a project (`tidal project add`) and its members "
            f"(`tidal project member add {project} {u.name}`)")
    if p is None:
        raise ValidationError(f"no project {project}", field="project", projects=mine[:SHOWN], hint=hint)
    raise Forbidden(f"user {u.name} is not a member of project {project}", field="project", projects=mine[:SHOWN],
                    hint=hint)


def view(s: Session, p: Project) -> dict[str, Any]:
    _, use = userlimits.use_by(s, project=p.name)
    return {"name": p.name, "created_at": p.created_at, "created_by": p.created_by,
            "members": None if p.name == DEFAULT else members(s, p.name),
            "limits": {k: v.to_json() for k, v in userlimits.project_limits(s, p).items()},
            "usage": use.get(p.name, userlimits.Use()).to_json()}


def listing(s: Session, user: str | None = None) -> list[dict[str, Any]]:
    """Every project (``user``: only theirs), by name, with its members and what its jobs use."""
    _, use = userlimits.use_by(s)
    q = select(Project).order_by(Project.name)
    if user is not None:
        q = q.where(Project.name.in_(of_user(s, user)))
    rows = list(s.scalars(q))
    member_rows = s.execute(select(ProjectMember.project, ProjectMember.username)
                            .order_by(ProjectMember.username))
    by_project: dict[str, list[str]] = {}
    for project, name in member_rows:
        by_project.setdefault(project, []).append(name)
    return [{"name": p.name, "created_at": p.created_at, "created_by": p.created_by,
             "members": None if p.name == DEFAULT else by_project.get(p.name, []),
             "limits": {k: v.to_json() for k, v in userlimits.project_limits(s, p).items()},
             "usage": use.get(p.name, userlimits.Use()).to_json()} for p in rows]


def set_limits(s: Session, name: str, changes: dict[str, Any]) -> Project:
    p = get(s, name)
    p.limits = userlimits.apply(p.limits, userlimits.parse_changes(changes, userlimits.PROJECT_LIMITS))
    return p
