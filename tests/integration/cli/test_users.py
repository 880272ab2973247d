"""`tidal user add|ls|show|set|rm`, `tidal whoami`, `tidal project ...` and the users' tokens of `tidal token`
(`create --user`, `ls --user`, `rotate`, `revoke ID`) through the real `tidal` against a real API."""

from __future__ import annotations

import json
import re

import httpx

from tests.integration.cli.conftest import Served
from tidal.cli.listings import LISTINGS
from tidal.control import tokens

AGO = r"\d+s ago"


def _admin(served: Served) -> dict[str, str]:
    with served.plane.db.tx() as s:
        return {"TIDAL_TOKEN": tokens.create_user(s, "root", "admin")}


def test_user_add_ls_show_rm(served_plane: Served) -> None:
    s = served_plane
    admin = _admin(s)
    assert s.cli("project", "add", "vision", env=admin).stdout == "project vision added, members: -\n"
    out = s.cli("user", "add", "bob", "--unix-user", "nobody", "--project", "vision", env=admin).stdout.splitlines()
    m = re.fullmatch(r"user bob \(user\) added, projects: default, vision; its token (tk-[0-9a-f]{12}) \(shown "
                     r"once\):", out[0])
    assert m and out[1].startswith("tdl_") and len(out) == 2, out
    bob = {"TIDAL_TOKEN": out[1]}
    q = s.cli("user", "add", "-q", "carol", env=admin).stdout
    assert q.startswith("tdl_") and len(q.split()) == 1

    assert s.cli("user", "ls", env=admin).stdout.splitlines() == [
        "NAME     ROLE   UNIX USER  PROJECTS         TOKENS  QUEUED  DEVICES",
        "alice    user   -          default          1       0       0",
        "bob      user   nobody     default, vision  1       0       0",
        "carol    user   -          default          1       0       0",
        "cluster  agent  -          -                1       0       0",
        "root     admin  -          default          1       0       0",
    ]
    rows = json.loads(s.cli("user", "ls", "-o", "json", env=admin).stdout)
    assert rows == httpx.get(s.url + "/v1/users", headers={"Authorization": f"Bearer {admin['TIDAL_TOKEN']}"},
                             timeout=30).json()
    assert list(rows[0]) == list(LISTINGS["user ls"].fields)

    r = httpx.post(s.url + "/v1/jobs", headers={"Authorization": f"Bearer {bob['TIDAL_TOKEN']}"},
                   json={"command": ["train"], "workdir": str(s.plane.workdir), "project": "vision"}, timeout=30)
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    shown = [
        "user bob  role user  runs as nobody",
        "projects: default, vision",
        "tokens: 1 active",
        "LIMIT        VALUE      FROM     IN USE",
        "rate         unlimited  default  0 refused",  # a test's plane: no request rate
        "burst        500        default",
        "max queued   1000       default  1 waiting",
        "max devices  unlimited  default  0 held",
    ]
    assert s.cli("user", "show", "bob", env=admin).stdout.splitlines() == shown
    assert s.cli("whoami", env=bob).stdout.splitlines() == shown
    detail = json.loads(s.cli("user", "show", "bob", "-o", "json", env=admin).stdout)
    assert list(detail) == list(LISTINGS["user show"].fields)
    assert detail == json.loads(s.cli("whoami", "-o", "json", env=bob).stdout)

    out = s.cli("user", "set", "bob", "--max-queued", "5", "--rate", "unlimited", env=admin).stdout.splitlines()
    assert out[4:7] == ["rate         unlimited  user     0 refused", "burst        500        default",
                        "max queued   5          user     1 waiting"]
    p = s.cli("user", "set", "bob", "--max-queued", "many", env=admin, check=False)
    assert p.returncode == 1 and "error: max_queued: 'many' is not a number, 'unlimited' or 'default'" in p.stderr

    # A user with an unfinished job is not removed unless forced; then its job is cancelled, and said so.
    p = s.cli("user", "rm", "bob", env=admin, check=False)
    assert p.returncode == 1
    assert p.stderr.splitlines() == [
        f"error: user bob has 1 unfinished job(s): {job}",
        "hint: cancel them first, or remove the user with --force, which cancels them (`tidal user rm bob --force`)"]
    assert s.cli("whoami", env=bob).returncode == 0
    out = s.cli("user", "rm", "bob", "--force", env=admin).stdout
    assert out == (f"removed user bob; cancelled its 1 unfinished job(s): {job}; revoked its 1 token(s); took it out "
                   "of project(s) vision\n")
    p = s.cli("whoami", env=bob, check=False)
    assert p.returncode == 1 and "error: invalid API token: unknown, or revoked" in p.stderr
    assert s.cli("user", "rm", "carol", env=admin).stdout == "removed user carol; revoked its 1 token(s)\n"
    assert [r["name"] for r in json.loads(s.cli("user", "ls", "-o", "json", env=admin).stdout)] == [
        "alice", "cluster", "root"]
    # A user cannot manage users.
    p = s.cli("user", "ls", check=False)
    assert p.returncode == 1 and "error: this needs an admin token" in p.stderr


def test_token_create_ls_rotate_revoke_for_users(served_plane: Served) -> None:
    s = served_plane
    admin = _admin(s)
    out = s.cli("token", "create", "--user", "alice", "--ttl", "90d", "--label", "ci", env=admin).stdout.splitlines()
    m = re.fullmatch(r"token (tk-[0-9a-f]{12}) of user alice, label ci, valid until [-0-9: ]+ \(shown once\):",
                     out[0])
    assert m and out[1].startswith("tdl_"), out
    ci, ci_token = m.group(1), out[1]
    assert s.cli("whoami", env={"TIDAL_TOKEN": ci_token}).stdout.startswith("user alice  role user")

    lines = s.cli("token", "ls", "--user", "alice", env=admin).stdout.splitlines()
    assert lines[0] == "ID               USER   LABEL    STATE   CREATED  EXPIRES     LAST USED"
    assert re.fullmatch(rf"tk-[0-9a-f]{{12}}  alice  initial  active  {AGO} +never +({AGO}|-)", lines[1]), lines
    assert re.fullmatch(rf"{ci}  alice  ci       active  {AGO} +in 89d 23h  {AGO}", lines[2]), lines
    # A user's `tidal token ls` is their own tokens; an admin's, without --user, the join tokens (as before).
    mine = json.loads(s.cli("token", "ls", "-o", "json").stdout)
    assert mine == json.loads(s.cli("token", "ls", "--user", "alice", "-o", "json", env=admin).stdout)
    assert list(mine[0]) == list(LISTINGS["token ls: a user's tokens"].fields)
    assert s.cli("token", "ls", env=admin).stdout.splitlines()[0] == (
        "ID       KIND     NODE          STATE   CREATED  EXPIRES  USED")

    # Rotated: a new token with the same label; the old one is refused at once.
    out = s.cli("token", "rotate", ci).stdout.splitlines()
    m = re.fullmatch(rf"token (tk-[0-9a-f]{{12}}) of user alice replaces {ci} \(revoked\), label ci, valid until "
                     r"[-0-9: ]+ \(shown once\):", out[0])
    assert m and out[1].startswith("tdl_"), out
    rotated, rotated_token = m.group(1), out[1]
    p = s.cli("whoami", env={"TIDAL_TOKEN": ci_token}, check=False)
    assert p.returncode == 1 and f"error: API token {ci} of user alice was revoked" in p.stderr
    assert s.cli("whoami", env={"TIDAL_TOKEN": rotated_token}).returncode == 0
    q = s.cli("token", "rotate", "-q", rotated, env=admin).stdout
    assert q.startswith("tdl_") and len(q.split()) == 1

    new = json.loads(s.cli("token", "ls", "-o", "json").stdout)[-1]
    assert s.cli("token", "revoke", new["id"]).stdout == f"revoked token {new['id']} of user alice\n"
    p = s.cli("whoami", env={"TIDAL_TOKEN": q.strip()}, check=False)
    assert p.returncode == 1 and "was revoked" in p.stderr
    states = [t["state"] for t in json.loads(s.cli("token", "ls", "-o", "json").stdout)]
    assert states == ["active", "revoked", "revoked", "revoked"]
    # Join tokens are made and revoked as before.
    out = s.cli("token", "create", "--node", "gpu-1", "-q", env=admin).stdout
    assert out.startswith("tdj_")
    p = s.cli("token", "create", "--node", "n", "--user", "alice", env=admin, check=False)
    assert p.returncode == 1 and "error: give --node NODE (a join token) or --user NAME" in p.stderr
