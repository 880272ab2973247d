"""Per-user and per-project limits through the API: a user's request rate (429 with Retry-After, then taken again),
their queued jobs and a project's (a submission beyond is refused, nothing stored), an admin's overrides over the
defaults, the devices each user may hold (for the scheduler), and what is used of them, in the API and the
metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tidal.control import tokens, userlimits
from tidal.control.store.models import JobRow
from tidal.control.userlimits import Defaults
from tidal.testing import FakeClock, wait_until
from tidal.testing.control import FakeAgent, Plane, start


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _admin(plane: Plane) -> dict[str, str]:
    with plane.db.tx() as s:
        return _bearer(tokens.create_user(s, "root", "admin"))


def _submit(plane: Plane, who: dict[str, str] | None = None, **kw: Any) -> Any:
    return plane.http.post("/v1/jobs", headers=who or plane.as_user(),
                           json={"command": ["train"], "workdir": str(plane.workdir), **kw})


@pytest.fixture
def limited(tmp_path: Path) -> Any:
    """A plane whose users may have 2 jobs waiting, and request 2 a second (bursts of 3; an admin 100)."""
    p = Plane(tmp_path, limits=Defaults(user_rate=2.0, user_burst=3, admin_rate=100.0, admin_burst=100,
                                        user_max_queued=2))
    yield p
    p.db.close()


@pytest.fixture
def queued(tmp_path: Path) -> Any:
    """A plane whose users may have 2 jobs waiting (and no request rate)."""
    p = Plane(tmp_path, limits=Defaults(user_rate=None, admin_rate=None, user_max_queued=2))
    yield p
    p.db.close()


def test_over_its_rate_a_user_is_answered_429_with_retry_after_then_taken_again(limited: Plane) -> None:
    clock = FakeClock(2_000_000_000.0)
    limited.db.info["clock"] = clock
    alice, admin = limited.as_user(), _admin(limited)
    assert limited.http.get("/v1/jobs", headers=alice).status_code == 200  # looked up: from now on, counted
    assert [limited.http.get("/v1/jobs", headers=alice).status_code for _ in range(3)] == [200, 200, 200]
    r = limited.http.get("/v1/jobs", headers=alice)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert r.json() == {"error": "TooManyRequests", "message": "user alice is over their request rate of 2 "
                        "requests/s (bursts of 3): try again in 1s", "rate": 2.0, "burst": 3, "retry_after": 1,
                        "hint": "send fewer requests; an admin may raise the limit (`tidal user set alice --rate R "
                                "--burst B`)"}
    # Refused before anything is done: a submission over the rate stores nothing.
    assert _submit(limited).status_code == 429
    # Another user, an admin (a higher default), the agents' routes and the metrics are not held back by it.
    assert limited.http.get("/v1/jobs", headers=admin).status_code == 200
    assert FakeAgent(limited, "node-1", "A").register() == 200
    assert limited.http.get("/metrics", headers=admin).status_code == 200
    assert limited.http.get("/ui/", headers=alice).status_code == 200
    clock.advance(0.4)  # not yet a whole request's worth
    r = limited.http.get("/v1/jobs", headers=alice)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    clock.advance(0.5)  # ... now there is (2 a second)
    assert limited.http.get("/v1/jobs", headers=alice).status_code == 200
    me = limited.http.get("/v1/me", headers=admin).json()
    assert me["limits"]["rate"] == {"value": 100.0, "source": "default"}
    shown = limited.http.get("/v1/users/alice", headers=admin).json()
    assert shown["usage"]["requests_refused"] == 3
    metrics = limited.http.get("/metrics", headers=admin).text
    assert 'tidal_user_requests_refused_total{user="alice"} 3.0' in metrics
    with limited.db.read() as s:
        assert s.query(JobRow).count() == 0


def test_the_rate_is_measured_in_real_time(tmp_path: Path) -> None:
    p = Plane(tmp_path, limits=Defaults(user_rate=5.0, user_burst=1))
    try:
        assert p.http.get("/v1/jobs", headers=p.as_user()).status_code == 200
        codes = [p.http.get("/v1/jobs", headers=p.as_user()).status_code for _ in range(2)]
        assert 429 in codes
        # Within a fifth of a second one more request is allowed again.
        wait_until(lambda: p.http.get("/v1/jobs", headers=p.as_user()).status_code == 200, timeout=5,
                   what="a request to be taken again", interval=0.05)
    finally:
        p.db.close()


def test_a_users_override_beats_the_default_and_is_seen_at_once(limited: Plane) -> None:
    clock = FakeClock(2_000_000_000.0)
    limited.db.info["clock"] = clock
    alice, admin = limited.as_user(), _admin(limited)
    assert [limited.http.get("/v1/jobs", headers=alice).status_code for _ in range(5)] == [200] * 4 + [429]
    r = limited.http.patch("/v1/users/alice/limits", headers=admin, json={"rate": 1000, "burst": 1000,
                                                                         "max_queued": 3})
    assert r.status_code == 200, r.text
    assert r.json()["limits"] == {"rate": {"value": 1000.0, "source": "user"},
                                  "burst": {"value": 1000, "source": "user"},
                                  "max_queued": {"value": 3, "source": "user"},
                                  "max_devices": {"value": None, "source": "default"}}
    # At once, the default rate no longer holds alice back; her own limit of 3 jobs waiting does, not the default 2.
    clock.advance(1)
    assert all(limited.http.get("/v1/jobs", headers=alice).status_code == 200 for _ in range(20))
    ids = [_submit(limited).json()["id"] for _ in range(3)]
    r = _submit(limited)
    assert r.status_code == 409 and (r.json()["limit"], r.json()["queued"]) == (3, 3)
    # Back to the default: 2.
    r = limited.http.patch("/v1/users/alice/limits", headers=admin, json={"max_queued": "default"})
    assert r.json()["limits"]["max_queued"] == {"value": 2, "source": "default"}
    assert limited.http.post(f"/v1/jobs/{ids[0]}/cancel", headers=alice).status_code == 200
    assert _submit(limited).json()["queued"] == 2  # still 2 waiting: refused
    r = limited.http.patch("/v1/users/alice/limits", headers=admin, json={"max_queued": "unlimited"})
    assert r.json()["limits"]["max_queued"] == {"value": None, "source": "user"}
    assert _submit(limited).status_code == 201
    for body, field, message in (
            ({"rate": 0}, "rate", "rate: 0 requests/s; a rate is more than 0 and at most 1e+06"),
            ({"max_queued": -1}, "max_queued", "max_queued: -1; a whole number from 0 to 1000000000"),
            ({"burst": 1.5}, "burst", "burst: 1.5; a whole number from 1 to 1000000000"),
            ({"max_devices": "lots"}, "max_devices", "max_devices: 'lots' is not a number, 'unlimited' or 'default'")):
        r = limited.http.patch("/v1/users/alice/limits", headers=admin, json=body)
        assert r.status_code == 422 and (r.json()["field"], r.json()["message"]) == (field, message), r.text
    assert limited.http.patch("/v1/users/alice/limits", headers=alice, json={"max_queued": 9}).status_code == 403
    # The default rate again, at once: bursts of 3.
    r = limited.http.patch("/v1/users/alice/limits", headers=admin, json={"rate": "none", "burst": "default"})
    assert r.json()["limits"]["rate"] == {"value": 2.0, "source": "default"}
    assert [limited.http.get("/v1/jobs", headers=alice).status_code for _ in range(5)] == [200] * 4 + [429]


def test_a_submission_over_the_queued_jobs_limit_is_refused_and_nothing_is_stored(queued: Plane) -> None:
    agent = FakeAgent(queued, "node-1", "A")
    agent.register()
    running = queued.submit()
    start(queued, agent, running)  # a running job does not count: it is not waiting
    waiting = [queued.submit(), queued.submit()]
    r = _submit(queued, name="third")
    assert r.status_code == 409
    assert r.json() == {
        "error": "Conflict",
        "message": "user alice has 2 job(s) waiting (pending, held or preempted), the most it may have: submit "
                   "again once some have started or ended",
        "hint": "`tidal ls` lists them; an admin may raise the limit: `tidal user set alice --max-queued N`",
        "limit": 2, "queued": 2, "user": "alice"}
    with queued.db.read() as s:
        assert sorted(j.id for j in s.query(JobRow)) == sorted([running, *waiting])
        assert userlimits.queued(s, "alice") == 2
    me = queued.http.get("/v1/me", headers=queued.as_user()).json()
    assert me["usage"] == {"queued": 2, "devices": 1, "requests_refused": 0}
    assert me["limits"]["max_queued"] == {"value": 2, "source": "default"}
    metrics = queued.http.get("/metrics", headers=_admin(queued)).text
    assert 'tidal_user_queued_jobs{user="alice"} 2.0' in metrics
    assert 'tidal_user_devices_held{user="alice"} 1.0' in metrics
    # One ends: there is room again.
    assert queued.http.post(f"/v1/jobs/{waiting[0]}/cancel", headers=queued.as_user()).status_code == 200
    assert _submit(queued).status_code == 201


def test_a_projects_queued_jobs_limit_counts_every_members_jobs(queued: Plane) -> None:
    admin = _admin(queued)
    with queued.db.tx() as s:
        bob = tokens.create_user(s, "bob", "user")
    r = queued.http.post("/v1/projects", headers=admin, json={"name": "vision", "members": ["alice", "bob"]})
    assert r.status_code == 201, r.text
    r = queued.http.patch("/v1/projects/vision/limits", headers=admin, json={"max_queued": 2})
    assert r.status_code == 200 and r.json()["limits"]["max_queued"] == {"value": 2, "source": "project"}
    assert _submit(queued, project="vision").status_code == 201
    assert _submit(queued, _bearer(bob), project="vision").status_code == 201
    r = _submit(queued, _bearer(bob), project="vision")
    assert r.status_code == 409
    assert r.json()["message"] == ("project vision has 2 job(s) waiting (pending, held or preempted), the most it "
                                   "may have: submit again once some have started or ended")
    assert (r.json()["limit"], r.json()["queued"], r.json()["project"]) == (2, 2, "vision")
    assert _submit(queued, _bearer(bob)).status_code == 201  # under default: not vision's limit
    shown = queued.http.get("/v1/projects/vision", headers=queued.as_user()).json()
    assert shown["usage"] == {"queued": 2, "devices": 0} and shown["members"] == ["alice", "bob"]
    assert 'tidal_project_queued_jobs{project="vision"} 2.0' in queued.http.get("/metrics", headers=admin).text


def test_device_caps_are_each_users_with_a_finite_limit(tmp_path: Path) -> None:
    p = Plane(tmp_path, limits=Defaults(user_max_devices=8))
    try:
        admin = _admin(p)
        with p.db.tx() as s:
            tokens.create_user(s, "bob", "user")
            tokens.create_user(s, "prometheus", "metrics")
        p.http.patch("/v1/users/bob/limits", headers=admin, json={"max_devices": 2})
        p.http.patch("/v1/users/root/limits", headers=admin, json={"max_devices": "unlimited"})
        p.http.post("/v1/projects", headers=admin, json={"name": "vision"})
        p.http.patch("/v1/projects/vision/limits", headers=admin, json={"max_devices": 4})
        with p.db.read() as s:
            assert userlimits.device_caps(s) == {"alice": 8, "bob": 2}
            assert userlimits.project_device_caps(s) == {"vision": 4}
    finally:
        p.db.close()


def test_the_settings_give_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from tidal.config import Settings

    for k, v in {"TIDAL_USER_RATE": "20", "TIDAL_USER_BURST": "40", "TIDAL_USER_MAX_QUEUED": "0",
                 "TIDAL_USER_MAX_DEVICES": "16", "TIDAL_PROJECT_MAX_QUEUED": "5000"}.items():
        monkeypatch.setenv(k, v)
    d = Defaults.from_settings(Settings())
    assert (d.user_rate, d.user_burst, d.user_max_queued, d.user_max_devices, d.project_max_queued,
            d.project_max_devices, d.admin_rate) == (20.0, 40, None, 16, 5000, None, 500.0)
    assert Defaults.from_settings(Settings.model_construct()) == Defaults()  # the documented defaults


def test_the_bucket_table_forgets_idle_users() -> None:
    from tidal.control.api.ratelimit import SWEEP_S, Buckets

    b = Buckets()
    t = time.monotonic()
    assert b.take("alice", 1.0, 2, t) == 0.0 and b.take("bob", 1.0, 2, t) == 0.0
    assert set(b.buckets) == {"alice", "bob"}
    assert b.take("alice", 1.0, 2, t + SWEEP_S) == 0.0  # a sweep: both had filled up again; alice's is new
    assert set(b.buckets) == {"alice"}
