"""Projects and their members (docs/cluster.md, Users, tokens and projects): admins make, limit and remove them
and manage their members; a user lists and reads the projects they belong to (``default`` is everyone's)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tidal.control import projects
from tidal.control.api.auth import Admin, User
from tidal.control.api.context import Ctx
from tidal.control.api.schemas import ProjectCreate, ProjectLimits
from tidal.control.store.models import ProjectMember
from tidal.errors import Forbidden

router = APIRouter(prefix="/v1/projects")


@router.post("", status_code=201)
def create_project(body: ProjectCreate, p: Admin, ctx: Ctx) -> dict[str, Any]:
    with ctx.db.tx() as s:
        return projects.view(s, projects.add(s, body.name, p.name, body.members))


@router.get("")
def list_projects(p: User, ctx: Ctx) -> list[dict[str, Any]]:
    """Every project for an admin; a user's own (``default`` and those they are a member of) for a user."""
    with ctx.db.read() as s:
        return projects.listing(s, None if p.role == "admin" else p.name)


@router.get("/{name}")
def show_project(name: str, p: User, ctx: Ctx) -> dict[str, Any]:
    """A project: its members (null for ``default``: every user), limits and what its jobs use."""
    with ctx.db.read() as s:
        row = projects.get(s, name)
        if p.role != "admin" and name != projects.DEFAULT and s.get(ProjectMember, (name, p.name)) is None:
            raise Forbidden(f"user {p.name} is not a member of project {name}", field="project",
                            hint="`tidal project ls` lists yours")
        return projects.view(s, row)


@router.delete("/{name}")
def remove_project(name: str, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Remove a project and its memberships: refused for ``default``, and while jobs under it are unfinished."""
    with ctx.db.tx() as s:
        return projects.remove(s, name)


@router.patch("/{name}/limits")
def set_project_limits(name: str, body: ProjectLimits, p: Admin, ctx: Ctx) -> dict[str, Any]:
    """Change a project's limits: each a number, ``"unlimited"``, or ``"default"``."""
    with ctx.db.tx() as s:
        return projects.view(s, projects.set_limits(s, name, body.model_dump(exclude_unset=True)))


@router.put("/{name}/members/{user}")
def add_member(name: str, user: str, p: Admin, ctx: Ctx) -> dict[str, Any]:
    with ctx.db.tx() as s:
        added = projects.add_member(s, name, user)
    return {"project": name, "user": user, "added": added}


@router.delete("/{name}/members/{user}")
def remove_member(name: str, user: str, p: Admin, ctx: Ctx) -> dict[str, Any]:
    with ctx.db.tx() as s:
        projects.remove_member(s, name, user)
    return {"project": name, "user": user, "removed": True}
