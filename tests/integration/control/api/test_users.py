"""Users, their tokens and projects through the API: an admin adds, lists, shows and removes users (refused while
they have unfinished jobs, unless forced) and manages projects and members; a user manages their own tokens
(create, list, rotate, revoke, time to live); a revoked or expired token is refused at once, also where the API
had it cached, and by another API process sharing the database within a second; a user submits only under a
project they belong to; a user-role account that runs as root needs allow_root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tidal.control import tokens
from tidal.control.api.app import Context, create_app
from tidal.control.api.auth import RECHECK_S, TOUCH_EVERY_S
from tidal.control.store.models import JobRow, Project, ProjectMember, User, UserToken
from tidal.testing import FakeClock
from tidal.testing.control import FakeAgent, Plane, start


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _admin(plane: Plane) -> dict[str, str]:
    with plane.db.tx() as s:
        return _bearer(tokens.create_user(s, "root", "admin"))


def _submit(plane: Plane, who: dict[str, str], **kw: Any) -> Any:
    return plane.http.post("/v1/jobs", headers=who, json={"command": ["train"], "workdir": str(plane.workdir), **kw})


def _clock(plane: Plane) -> FakeClock:
    clock = FakeClock(2_000_000_000.0)
    plane.db.info["clock"] = clock
    return clock


def test_tokens_are_created_listed_rotated_revoked_and_expire(plane: Plane) -> None:
    clock = _clock(plane)
    admin = _admin(plane)
    alice = plane.as_user()
    r = plane.http.post("/v1/users/alice/tokens", headers=alice, json={"label": "ci", "ttl": 3600})
    assert r.status_code == 201, r.text
    ci = r.json()
    assert ci["token"].startswith("tdl_") and ci["id"].startswith("tk-") and ci["label"] == "ci"
    assert (ci["user"], ci["created_by"], ci["expires_at"], ci["state"]) == ("alice", "alice", 2_000_003_600.0,
                                                                            "active")
    assert plane.http.get("/v1/whoami", headers=_bearer(ci["token"])).json() == {"name": "alice", "role": "user"}

    listed = plane.http.get("/v1/users/alice/tokens", headers=alice).json()
    assert [(t["label"], t["state"], t["expires_at"]) for t in listed] == [("initial", "active", None),
                                                                           ("ci", "active", 2_000_003_600.0)]
    assert not any("token" in t or "token_hash" in t for t in listed)  # never a secret, nor its hash
    assert listed == plane.http.get("/v1/users/alice/tokens", headers=admin).json()

    # A rotation: a new secret with the same label and time to live; the old one is refused at once.
    clock.advance(100)
    r = plane.http.post(f"/v1/user-tokens/{ci['id']}/rotate", headers=alice)
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["replaced"] == ci["id"] and new["id"] != ci["id"] and new["token"] != ci["token"]
    assert (new["label"], new["expires_at"]) == ("ci", 2_000_003_700.0)
    old = plane.http.get("/v1/whoami", headers=_bearer(ci["token"]))
    assert old.status_code == 401
    assert old.json()["message"] == f"API token {ci['id']} of user alice was revoked"
    assert plane.http.get("/v1/whoami", headers=_bearer(new["token"])).status_code == 200

    # Its time to live runs out: refused at once, though the API had it cached.
    clock.advance(3601)
    r = plane.http.get("/v1/whoami", headers=_bearer(new["token"]))
    assert r.status_code == 401 and r.json()["message"] == f"API token {new['id']} of user alice expired 1s ago"
    states = {t["id"]: t["state"] for t in plane.http.get("/v1/users/alice/tokens", headers=alice).json()}
    assert states == {listed[0]["id"]: "active", ci["id"]: "revoked", new["id"]: "expired"}
    # An expired token may be rotated (a revoked one may not).
    assert plane.http.post(f"/v1/user-tokens/{new['id']}/rotate", headers=admin).status_code == 201
    r = plane.http.post(f"/v1/user-tokens/{ci['id']}/rotate", headers=admin)
    assert r.status_code == 409 and r.json()["message"] == f"token {ci['id']} was revoked: it is not rotated"


def test_a_revoked_token_is_refused_at_once(plane: Plane) -> None:
    admin = _admin(plane)
    r = plane.http.post("/v1/users/alice/tokens", headers=admin, json={"label": "laptop"})
    laptop = r.json()
    assert laptop["expires_at"] is None and laptop["created_by"] == "root"
    who = _bearer(laptop["token"])
    assert plane.http.get("/v1/jobs", headers=who).status_code == 200  # now in the API's cache
    r = plane.http.delete(f"/v1/user-tokens/{laptop['id']}", headers=plane.as_user())
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    r = plane.http.get("/v1/jobs", headers=who)
    assert r.status_code == 401 and r.json()["message"] == f"API token {laptop['id']} of user alice was revoked"
    assert plane.http.get("/v1/jobs", headers=plane.as_user()).status_code == 200  # her other token works


def test_another_api_process_refuses_a_revoked_token_within_a_second(plane: Plane) -> None:
    clock = _clock(plane)
    admin = _admin(plane)
    other = TestClient(create_app(Context(db=plane.db, home=plane.workdir)))  # a second worker, the same database
    token = plane.http.post("/v1/users/alice/tokens", headers=admin, json={}).json()
    who = _bearer(token["token"])
    assert other.get("/v1/jobs", headers=who).status_code == 200  # cached there
    assert plane.http.delete(f"/v1/user-tokens/{token['id']}", headers=admin).status_code == 200
    assert plane.http.get("/v1/jobs", headers=who).status_code == 401  # this process: at once
    clock.advance(0.5)
    assert other.get("/v1/jobs", headers=who).status_code == 200  # the other: from its cache, for now
    clock.advance(0.5)
    r = other.get("/v1/jobs", headers=who)
    assert r.status_code == 401 and "was revoked" in r.json()["message"]


def test_last_used_is_written_at_most_once_a_minute(plane: Plane) -> None:
    clock = _clock(plane)
    alice = plane.as_user()

    def last_used() -> float | None:
        with plane.db.read() as s:
            row = s.query(UserToken).filter(UserToken.username == "alice").one()
            return row.last_used_at

    assert plane.http.get("/v1/jobs", headers=alice).status_code == 200
    assert last_used() == 2_000_000_000.0
    for _ in range(5):  # looked up again every RECHECK_S, written only once a minute
        clock.advance(RECHECK_S)
        assert plane.http.get("/v1/jobs", headers=alice).status_code == 200
    assert last_used() == 2_000_000_000.0
    clock.advance(TOUCH_EVERY_S)
    assert plane.http.get("/v1/jobs", headers=alice).status_code == 200
    assert last_used() == 2_000_000_000.0 + 5 * RECHECK_S + TOUCH_EVERY_S


def test_users_tokens_are_their_own_and_bounded(plane: Plane) -> None:
    admin = _admin(plane)
    with plane.db.tx() as s:
        bob = _bearer(tokens.create_user(s, "bob", "user"))
    ci = plane.http.post("/v1/users/alice/tokens", headers=plane.as_user(), json={}).json()
    for method, path in (("POST", "/v1/users/alice/tokens"), ("GET", "/v1/users/alice/tokens")):
        r = plane.http.request(method, path, headers=bob, json={})
        assert r.status_code == 403 and r.json()["message"] == "user bob may manage their own tokens only, not " \
                                                               "alice's", r.text
    for method, path in (("POST", f"/v1/user-tokens/{ci['id']}/rotate"), ("DELETE", f"/v1/user-tokens/{ci['id']}")):
        r = plane.http.request(method, path, headers=bob)
        assert r.status_code == 404 and r.json()["message"] == f"no token {ci['id']}"  # not disclosed
    for body, field in (({"ttl": 0}, "ttl"), ({"ttl": 11 * 365 * 86400}, "ttl"), ({"label": "x" * 65}, "label")):
        r = plane.http.post("/v1/users/alice/tokens", headers=admin, json=body)
        assert r.status_code == 422 and r.json()["field"] == field, r.text
    r = plane.http.post("/v1/users/cluster/tokens", headers=admin, json={})
    assert r.status_code == 422 and r.json()["message"] == ("cluster is an agent credential: a node gets its own by "
                                                            "joining with a join token")
    assert plane.http.get("/v1/users/nobody/tokens", headers=admin).status_code == 404


def test_an_admin_adds_lists_and_shows_users(plane: Plane) -> None:
    admin = _admin(plane)
    assert plane.http.post("/v1/projects", headers=admin, json={"name": "vision"}).status_code == 201
    r = plane.http.post("/v1/users", headers=admin, json={"name": "bob", "unix_user": "nobody",
                                                          "projects": ["vision"]})
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["name"], made["role"], made["projects"]) == ("bob", "user", ["default", "vision"])
    bob = _bearer(made["token"])
    assert plane.http.get("/v1/me", headers=bob).json()["name"] == "bob"
    listed = {u["name"]: u for u in plane.http.get("/v1/users", headers=admin).json()}
    assert sorted(listed) == ["alice", "bob", "cluster", "root"]
    assert listed["bob"] == {"name": "bob", "role": "user", "unix_user": "nobody",
                             "created_at": listed["bob"]["created_at"], "projects": ["default", "vision"], "tokens": 1,
                             "usage": {"queued": 0, "devices": 0}}
    assert listed["cluster"]["projects"] == []
    shown = plane.http.get("/v1/users/bob", headers=admin).json()
    assert shown == plane.http.get("/v1/me", headers=bob).json()
    assert shown["limits"]["max_queued"] == {"value": 1000, "source": "default"}
    # A user reads their own account only; only an admin lists or adds users.
    r = plane.http.get("/v1/users/alice", headers=bob)
    assert r.status_code == 403 and r.json()["message"] == ("user bob may read their own account only (`GET "
                                                            "/v1/me`), not alice's")
    assert plane.http.get("/v1/users", headers=bob).status_code == 403
    assert plane.http.post("/v1/users", headers=bob, json={"name": "eve"}).status_code == 403
    r = plane.http.post("/v1/users", headers=admin, json={"name": "eve", "projects": ["nope"]})
    assert r.status_code == 404 and r.json()["message"] == "no project nope"
    with plane.db.read() as s:
        assert s.get(User, "eve") is None  # nothing of a refused request is kept
    assert plane.http.post("/v1/users", headers=admin, json={"name": "bob"}).status_code == 409


def test_a_user_account_that_runs_as_root_needs_allow_root(plane: Plane) -> None:
    admin = _admin(plane)
    r = plane.http.post("/v1/users", headers=admin, json={"name": "ops", "unix_user": "root"})
    assert r.status_code == 403
    assert r.json() == {
        "error": "Forbidden", "field": "unix_user",
        "message": "user ops's jobs would run as root (Unix account 'root' has uid 0): refused without allow_root",
        "hint": "give the user an ordinary Unix account (--unix-user), or, if its jobs must run as root, say so "
                "with --allow-root (API: \"allow_root\": true)"}
    with plane.db.read() as s:
        assert s.get(User, "ops") is None
    r = plane.http.post("/v1/users", headers=admin, json={"name": "ops", "unix_user": "root", "allow_root": True})
    assert r.status_code == 201 and r.json()["role"] == "user"
    # An admin's account is the operator's own: no flag needed.
    assert plane.http.post("/v1/users", headers=admin, json={"name": "boss", "role": "admin",
                                                            "unix_user": "root"}).status_code == 201


def test_a_user_submits_only_under_a_project_they_belong_to(plane: Plane) -> None:
    admin = _admin(plane)
    alice = plane.as_user()
    r = _submit(plane, alice, project="vision")
    assert r.status_code == 422
    assert r.json() == {"error": "ValidationError", "message": "no project vision", "field": "project",
                        "projects": ["default"],
                        "hint": "your projects: default; an admin adds a project (`tidal project add`) and its "
                                "members (`tidal project member add vision alice`)"}
    r = plane.http.post("/v1/projects", headers=admin, json={"name": "vision", "members": ["root"]})
    assert r.status_code == 201, r.text
    plane.http.post("/v1/projects", headers=admin, json={"name": "speech", "members": ["alice"]})
    r = _submit(plane, alice, project="vision")
    assert r.status_code == 403
    assert r.json() == {"error": "Forbidden", "message": "user alice is not a member of project vision",
                        "field": "project", "projects": ["default", "speech"],
                        "hint": "your projects: default, speech; an admin adds a project (`tidal project add`) and "
                                "its members (`tidal project member add vision alice`)"}
    assert _submit(plane, alice, project="speech").status_code == 201
    assert _submit(plane, alice).status_code == 201  # default: every user's
    assert _submit(plane, admin, project="vision").status_code == 201  # an admin: any project there is
    r = plane.http.put("/v1/projects/vision/members/alice", headers=admin)
    assert r.status_code == 200 and r.json() == {"project": "vision", "user": "alice", "added": True}
    assert _submit(plane, alice, project="vision").status_code == 201
    assert plane.http.delete("/v1/projects/vision/members/alice", headers=admin).status_code == 200
    assert _submit(plane, alice, project="vision").status_code == 403
    with plane.db.read() as s:
        assert sorted((j.owner, j.spec["project"]) for j in s.query(JobRow)) == [
            ("alice", "default"), ("alice", "speech"), ("alice", "vision"), ("root", "vision")]
    assert [p["name"] for p in plane.http.get("/v1/projects", headers=alice).json()] == ["default", "speech"]
    assert [p["name"] for p in plane.http.get("/v1/projects", headers=admin).json()] == ["default", "speech",
                                                                                         "vision"]
    assert plane.http.get("/v1/projects/vision", headers=alice).status_code == 403


def test_project_names_are_checked(plane: Plane) -> None:
    admin = _admin(plane)
    rule = "letters, digits, '-', '_' and '.', starting with a letter or digit, at most 64 characters"
    r = _submit(plane, plane.as_user(), project="../../etc")
    assert r.status_code == 422
    assert (r.json()["field"], r.json()["message"]) == ("project", f"bad project name '../../etc': {rule}")
    for name in ("../../etc", "..", ".hidden", "a/b", "x" * 65, "", "a b"):
        r = plane.http.post("/v1/projects", headers=admin, json={"name": name})
        assert r.status_code == 422 and r.json()["message"] == f"bad project name {name!r}: {rule}", (name, r.text)
    with plane.db.read() as s:
        assert [p.name for p in s.query(Project)] == ["default"] and s.query(JobRow).count() == 0
    assert plane.http.post("/v1/projects", headers=admin, json={"name": "team-a.2026_x"}).status_code == 201
    assert plane.http.post("/v1/projects", headers=admin, json={"name": "team-a.2026_x"}).status_code == 409
    r = plane.http.delete("/v1/projects/default", headers=admin)
    assert r.status_code == 409 and r.json()["message"] == "project default is every user's: it cannot be removed"


def test_removing_a_user_with_unfinished_jobs_needs_force(plane: Plane) -> None:
    admin = _admin(plane)
    agent = FakeAgent(plane, "node-1", "A")
    agent.register()
    running = plane.submit()
    start(plane, agent, running)
    waiting = plane.submit()
    plane.add_projects("vision")
    r = plane.http.delete("/v1/users/alice", headers=admin)
    assert r.status_code == 409
    assert r.json() == {"error": "Conflict", "message": f"user alice has 2 unfinished job(s): {running}, {waiting}",
                        "field": "name", "jobs": [running, waiting], "unfinished": 2,
                        "hint": "cancel them first, or remove the user with --force, which cancels them (`tidal user "
                                "rm alice --force`)"}
    assert plane.http.get("/v1/jobs", headers=plane.as_user()).status_code == 200  # nothing was done
    r = plane.http.delete("/v1/users/alice", headers=admin, params={"force": "true"})
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "alice", "removed": True, "cancelled": [running, waiting], "tokens_revoked": 1,
                        "projects": ["vision"]}
    assert plane.http.get("/v1/jobs", headers=plane.as_user()).status_code == 401  # refused at once
    with plane.db.read() as s:
        assert {j.id: j.state for j in s.query(JobRow)} == {running: "cancelled", waiting: "cancelled"}
        assert s.get(User, "alice") is None
        assert s.query(UserToken).filter(UserToken.username == "alice").count() == 0
        assert s.query(ProjectMember).count() == 0
    assert [a["kind"] for a in agent.actions()] == ["kill"]  # its running job's ranks are killed
    # Without jobs, no force is needed; an agent credential and oneself are not removed so.
    with plane.db.tx() as s:
        tokens.create_user(s, "bob", "user")
    assert plane.http.delete("/v1/users/bob", headers=admin).json()["cancelled"] == []
    assert plane.http.delete("/v1/users/cluster", headers=admin).status_code == 409
    r = plane.http.delete("/v1/users/root", headers=admin)
    assert r.status_code == 409 and r.json()["message"] == "you cannot remove yourself"
    assert plane.http.delete("/v1/users/nobody", headers=admin).status_code == 404


def test_a_local_cluster_user_keeps_working(tmp_path: Path) -> None:
    """`tidal up`'s bootstrap: its user (run as root, a user account of uid 0) is made, with no request rate."""
    from tidal.config import Settings
    from tidal.control.bootstrap import LOCAL_USER_LIMITS, bootstrap
    from tidal.control.store.db import Database

    settings = Settings(home=tmp_path / "home")
    bootstrap(settings)
    db = Database(settings.db_url)
    try:
        with db.read() as s:
            users = {u.name: u for u in s.query(User)}
            assert {u.role for u in users.values()} == {"admin", "user", "agent"}
            (local,) = [u for u in users.values() if u.role == "user"]
            assert local.limits == LOCAL_USER_LIMITS
            token = (tmp_path / "home" / "tokens" / "user.token").read_text().strip()
            assert tokens.lookup(s, token) is not None
    finally:
        db.close()
