"""``tidal user add|ls|show|rm|set``, ``tidal project add|ls|show|rm|set|member``, ``tidal whoami``, and the users'
API tokens of ``tidal token`` (``create --user``, ``ls --user``, ``rotate``, ``revoke ID``; the command group and
its join tokens are :mod:`tidal.cli.deploy`'s). Admins manage users and projects; a user reads their own account
and manages their own tokens (docs/cluster.md, Users, tokens and projects)."""

from __future__ import annotations

import re
from typing import Any

import typer
from rich.markup import escape

from tidal.cli import listings, units
from tidal.cli.api import Api
from tidal.cli.formats import Column, Format, emit, output_option, print_rows, print_table
from tidal.cli.output import console
from tidal.cli.units import parse_duration
from tidal.errors import ValidationError

#: A user token's id (the control plane's tidal.control.tokens.TOKEN_ID).
TOKEN_ID = re.compile(r"tk-[0-9a-f]{12}")

user_app = typer.Typer(help="User accounts (admin): add, list, show, set limits, remove.", no_args_is_help=True)
project_app = typer.Typer(help="Projects and their members (admin; a user lists and shows their own).",
                          no_args_is_help=True)
member_app = typer.Typer(help="A project's members (admin).", no_args_is_help=True)

LIMIT_HELP = "a number, 'unlimited', or 'default' (or 'none': back to the default)"


def register(app: typer.Typer) -> None:
    app.add_typer(user_app, name="user")
    app.add_typer(project_app, name="project")
    project_app.add_typer(member_app, name="member")

    @app.command()
    def whoami(output: Format = output_option()) -> None:
        """Your account: role, projects, limits and what you use of them (jobs waiting, devices held, requests
        refused over your rate)."""
        me = Api().get("/v1/me")
        emit(me, output, lambda wide: _show_user(me))


def _limit_arg(text: str | None) -> Any:
    """A limit as given on the command line: a number is sent as one; a word as it is (the API checks it)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return text.strip().lower()
    return int(value) if value.is_integer() else value


def _changes(**given: str | None) -> dict[str, Any]:
    out = {k: _limit_arg(v) for k, v in given.items() if v is not None}
    if not out:
        raise ValidationError("give at least one limit to set", field="limits",
                              hint="--rate, --burst, --max-queued or --max-devices (a number, unlimited or default)")
    return out


# -- users ------------------------------------------------------------------------------------------------
@user_app.command("add")
def user_add(name: str = typer.Argument(..., metavar="NAME", help="the user's name (letters, digits, '-', '_', '.')"),
             role: str = typer.Option("user", "--role", help="user, admin or metrics (a scraper's: GET /metrics only)"),
             unix_user: str = typer.Option(None, "--unix-user", metavar="ACCOUNT",
                                           help="the Unix account the user's jobs run as on the nodes (default: the "
                                                "agent's own)"),
             project: list[str] = typer.Option([], "--project", metavar="PROJECT",
                                               help="make the user a member of this project (repeat)"),
             allow_root: bool = typer.Option(False, "--allow-root",
                                             help="allow a user whose Unix account is root (uid 0): its jobs run as "
                                                  "root on the nodes"),
             quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the token")) -> None:
    """Add a user; print its first API token (shown once)."""
    r = Api(who="admin").post("/v1/users", json={"name": name, "role": role, "unix_user": unix_user,
                                                 "projects": project, "allow_root": allow_root})
    if not quiet:
        console.print(f"user {escape(r['name'])} ({r['role']}) added, projects: {', '.join(r['projects']) or '-'}; "
                      f"its token {r['token_id']} (shown once):", highlight=False)
    print(r["token"])


@user_app.command("ls")
def user_ls(output: Format = output_option()) -> None:
    """List the users: role, Unix account, projects, tokens, jobs waiting and devices held."""
    print_rows(Api(who="admin").get("/v1/users"), listings.USERS, output)


@user_app.command("show")
def user_show(name: str = typer.Argument(..., metavar="NAME", help="the user"),
              output: Format = output_option()) -> None:
    """Show a user: role, projects, tokens, limits (each with where it comes from) and what the user uses of
    them."""
    u = Api(who="admin").get(f"/v1/users/{name}")
    emit(u, output, lambda wide: _show_user(u))


@user_app.command("set")
def user_set(name: str = typer.Argument(..., metavar="NAME", help="the user"),
             rate: str = typer.Option(None, "--rate", metavar="R", help=f"requests per second: {LIMIT_HELP}"),
             burst: str = typer.Option(None, "--burst", metavar="B", help=f"requests at once above it: {LIMIT_HELP}"),
             max_queued: str = typer.Option(None, "--max-queued", metavar="N",
                                            help=f"jobs waiting at once: {LIMIT_HELP}"),
             max_devices: str = typer.Option(None, "--max-devices", metavar="N",
                                             help=f"devices held at once: {LIMIT_HELP}"),
             output: Format = output_option()) -> None:
    """Set a user's limits (those not given stay as they are)."""
    changes = _changes(rate=rate, burst=burst, max_queued=max_queued, max_devices=max_devices)
    u = Api(who="admin").request("PATCH", f"/v1/users/{name}/limits", json=changes).json()
    emit(u, output, lambda wide: _show_user(u))


@user_app.command("rm")
def user_rm(name: str = typer.Argument(..., metavar="NAME", help="the user"),
            force: bool = typer.Option(False, "--force", help="cancel the user's unfinished jobs (else the user is "
                                                              "not removed while it has any)")) -> None:
    """Remove a user, its tokens and its project memberships."""
    r = Api(who="admin").delete(f"/v1/users/{name}", params={"force": "true"} if force else None)
    what = [f"removed user {r['name']}"]
    if r["cancelled"]:
        what.append(f"cancelled its {len(r['cancelled'])} unfinished job(s): {', '.join(r['cancelled'])}")
    what.append(f"revoked its {r['tokens_revoked']} token(s)")
    if r["projects"]:
        what.append(f"took it out of project(s) {', '.join(r['projects'])}")
    console.print(escape("; ".join(what)), highlight=False)


def _show_user(u: dict[str, Any]) -> None:
    console.print(escape(f"user {u['name']}  role {u['role']}  runs as {u['unix_user'] or '(the agent account)'}"),
                  highlight=False)
    console.print(escape(f"projects: {', '.join(u['projects']) or '-'}\ntokens: {u['tokens']} active"),
                  highlight=False)
    use = u["usage"]
    refused = use.get("requests_refused")
    in_use = {"rate": f"{refused} refused" if refused is not None else "-", "burst": "",
              "max_queued": f"{use['queued']} waiting", "max_devices": f"{use['devices']} held"}
    _limits_table(u["limits"], in_use)


def _limits_table(limits: dict[str, Any], in_use: dict[str, str]) -> None:
    rows = [{"limit": k.replace("_", " "), "value": listings.limit_value(k, v["value"]), "from": v["source"],
             "use": in_use.get(k, "")} for k, v in limits.items()]
    print_table(rows, [Column("LIMIT", lambda r: r["limit"]), Column("VALUE", lambda r: r["value"]),
                       Column("FROM", lambda r: r["from"]), Column("IN USE", lambda r: r["use"])])


# -- projects ----------------------------------------------------------------------------------------------
@project_app.command("add")
def project_add(name: str = typer.Argument(..., metavar="PROJECT",
                                           help="the project's name (letters, digits, '-', '_', '.')"),
                member: list[str] = typer.Option([], "--member", metavar="USER", help="a member (repeat)")) -> None:
    """Add a project (its members may then submit under it)."""
    p = Api(who="admin").post("/v1/projects", json={"name": name, "members": member})
    console.print(escape(f"project {p['name']} added, members: {', '.join(p['members']) or '-'}"), highlight=False)


@project_app.command("ls")
def project_ls(output: Format = output_option()) -> None:
    """List the projects (yours, for a user): members, jobs waiting, devices held and their limits."""
    print_rows(Api(who="admin").get("/v1/projects"), listings.PROJECTS, output)


@project_app.command("show")
def project_show(name: str = typer.Argument(..., metavar="PROJECT", help="the project"),
                 output: Format = output_option()) -> None:
    """Show a project: members, limits and what its jobs use of them."""
    p = Api(who="admin").get(f"/v1/projects/{name}")
    emit(p, output, lambda wide: _show_project(p))


@project_app.command("set")
def project_set(name: str = typer.Argument(..., metavar="PROJECT", help="the project"),
                max_queued: str = typer.Option(None, "--max-queued", metavar="N",
                                               help=f"jobs waiting at once, all members' together: {LIMIT_HELP}"),
                max_devices: str = typer.Option(None, "--max-devices", metavar="N",
                                                help=f"devices held at once by its jobs: {LIMIT_HELP}"),
                output: Format = output_option()) -> None:
    """Set a project's limits (those not given stay as they are)."""
    changes = _changes(max_queued=max_queued, max_devices=max_devices)
    p = Api(who="admin").request("PATCH", f"/v1/projects/{name}/limits", json=changes).json()
    emit(p, output, lambda wide: _show_project(p))


@project_app.command("rm")
def project_rm(name: str = typer.Argument(..., metavar="PROJECT", help="the project")) -> None:
    """Remove a project and its memberships (not while jobs under it are unfinished)."""
    r = Api(who="admin").delete(f"/v1/projects/{name}")
    console.print(escape(f"removed project {r['name']} ({r['members']} member(s))"), highlight=False)


@member_app.command("add")
def member_add(project: str = typer.Argument(..., metavar="PROJECT", help="the project"),
               user: str = typer.Argument(..., metavar="USER", help="the user")) -> None:
    """Make a user a member of a project."""
    r = Api(who="admin").request("PUT", f"/v1/projects/{project}/members/{user}").json()
    console.print(escape(f"{user} {'is now' if r['added'] else 'was already'} a member of project {project}"),
                  highlight=False)


@member_app.command("rm")
def member_rm(project: str = typer.Argument(..., metavar="PROJECT", help="the project"),
              user: str = typer.Argument(..., metavar="USER", help="the user")) -> None:
    """Take a user out of a project (their jobs under it go on)."""
    Api(who="admin").delete(f"/v1/projects/{project}/members/{user}")
    console.print(escape(f"{user} is no longer a member of project {project}"), highlight=False)


def _show_project(p: dict[str, Any]) -> None:
    members = "(every user)" if p["members"] is None else ", ".join(p["members"]) or "-"
    console.print(escape(f"project {p['name']}\nmembers: {members}"), highlight=False)
    use = p["usage"]
    _limits_table(p["limits"], {"max_queued": f"{use['queued']} waiting", "max_devices": f"{use['devices']} held"})


# -- users' tokens (`tidal token`) -------------------------------------------------------------------------
def token_create(user: str, ttl: str | None, label: str | None, quiet: bool) -> None:
    r = Api(who="admin").post(f"/v1/users/{user}/tokens",
                              json={"label": label, "ttl": parse_duration(ttl, "ttl") if ttl else None})
    _print_new_token(r, quiet, f"token {r['id']} of user {r['user']}")


def token_ls(user: str | None, output: Format) -> bool:
    """List ``user``'s tokens; without ``user``, the caller's unless the caller is an admin (False: the caller
    is an admin, and lists the join tokens instead)."""
    api = Api(who="admin")
    if user is None:
        me = api.get("/v1/whoami")
        if me["role"] == "admin":
            return False
        user = str(me["name"])
    print_rows(api.get(f"/v1/users/{user}/tokens"), listings.USER_TOKENS, output)
    return True


def token_rotate(token_id: str, quiet: bool) -> None:
    r = Api(who="admin").post(f"/v1/user-tokens/{token_id}/rotate")
    _print_new_token(r, quiet, f"token {r['id']} of user {r['user']} replaces {r['replaced']} (revoked)")


def token_revoke(token_id: str) -> None:
    r = Api(who="admin").delete(f"/v1/user-tokens/{token_id}")
    console.print(escape(f"revoked token {r['id']} of user {r['user']}"), highlight=False)


def _print_new_token(r: dict[str, Any], quiet: bool, what: str) -> None:
    if not quiet:
        until = f"until {units.clock(r['expires_at'])}" if r["expires_at"] is not None else "until revoked"
        label = f", label {r['label']}" if r["label"] else ""
        console.print(escape(f"{what}{label}, valid {until} (shown once):"), highlight=False)
    print(r["token"])
