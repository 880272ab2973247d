"""The dashboard's server side against the in-process control plane: its page and assets, the log-in into an
HttpOnly cookie that stands for the bearer header, the CSRF guard on cookie-authenticated requests that change
anything, and the cluster and jobs views (another user's job anonymous on its device, absent from the table)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tidal.control import tokens
from tidal.control.api.trend import Trend
from tidal.testing import wait_until
from tidal.testing.control import FakeAgent, Plane

UI = {"X-Tidal-UI": "1"}


def logged_in(p: Plane, token: str) -> TestClient:
    c = TestClient(p.http.app)
    r = c.post("/ui/login", json={"token": token}, headers=UI)
    assert r.status_code == 200, r.text
    return c


def running_job(p: Plane) -> str:
    a = FakeAgent(p, "node-1", "A1", devices=2)
    assert a.register() == 200
    jid = p.submit(tier="premium")
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 1}])
    return jid


def test_the_page_and_its_assets_are_served_with_a_strict_policy(plane: Plane) -> None:
    r = plane.http.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script src="/ui/static/app.js" defer></script>' in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self';")
    assert plane.http.get("/ui/static/app.js").headers["content-type"].startswith("text/javascript")
    assert plane.http.get("/ui/static/style.css").headers["content-type"].startswith("text/css")
    r = plane.http.get("/ui/static/__init__.py")
    assert r.status_code == 404 and r.json()["message"] == "no dashboard file '__init__.py'"


def test_log_in_sets_an_httponly_strict_cookie_and_refuses_bad_tokens(plane: Plane) -> None:
    r = plane.http.post("/ui/login", json={"token": "nope"}, headers=UI)
    assert r.status_code == 401 and r.json()["message"] == "invalid API token: unknown, or revoked"
    assert "set-cookie" not in r.headers
    r = plane.http.post("/ui/login", json={"token": plane.user})
    assert r.status_code == 403
    assert r.json()["message"] == "log in from the dashboard (the request lacks X-Tidal-UI: 1)"
    r = plane.http.post("/ui/login", json={"token": plane.agent}, headers=UI)
    assert r.status_code == 403
    assert r.json()["message"] == "a token of role agent cannot use the dashboard: log in with a user's or an " \
                                  "admin's token"
    r = plane.http.post("/ui/login", json={"token": "x" * 257}, headers=UI)
    assert r.status_code == 422 and r.json()["field"] == "token"
    r = plane.http.post("/ui/login", json={"token": plane.user}, headers={**UI, "Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["message"] == "cross-site log-in from 'https://evil.example' refused"

    r = plane.http.post("/ui/login", json={"token": plane.user}, headers=UI)
    assert r.status_code == 200 and r.json() == {"name": "alice", "role": "user"}
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"tidal_token={plane.user};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie


def test_the_cookie_authenticates_and_changes_need_the_header(plane: Plane) -> None:
    jid = running_job(plane)
    c = logged_in(plane, plane.user)
    assert c.get("/v1/whoami").json() == {"name": "alice", "role": "user"}
    assert c.get(f"/v1/jobs/{jid}").json()["state"] == "running"
    r = c.post(f"/v1/jobs/{jid}/preempt")  # what a cross-site form could send: the cookie alone
    assert r.status_code == 403
    assert r.json()["message"] == ("a request that changes anything and is authenticated by the dashboard's cookie "
                                   "must carry the header X-Tidal-UI: 1")
    r = c.post(f"/v1/jobs/{jid}/preempt", headers={**UI, "Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["message"] == "cross-site request from 'http://evil.example' refused"
    assert plane.job(jid)["state"] == "running"
    r = c.post(f"/v1/jobs/{jid}/preempt", headers={**UI, "Origin": "http://testserver"})
    assert r.status_code == 200 and r.json()["state"] == "checkpointing"
    # A bearer header still wins over the cookie, as for any API client.
    with plane.db.tx() as s:
        bob = tokens.create_user(s, "bob", "user")
    assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {bob}"}).json()["name"] == "bob"
    r = c.post("/ui/logout", headers=UI)
    assert r.status_code == 200
    r = c.get("/v1/whoami")
    assert r.status_code == 401 and r.json()["message"] == "missing API token"


def test_the_cluster_view_hides_who_holds_another_users_device(plane: Plane) -> None:
    jid = running_job(plane)
    with plane.db.tx() as s:
        bob = tokens.create_user(s, "bob", "user")
    mine = logged_in(plane, plane.user).get("/v1/ui/cluster").json()
    (node,) = mine["nodes"]
    assert (node["name"], node["up"]) == ("node-1", True)
    assert node["devices"] == [{"index": 0, "tier": "premium", "state": "running", "job": jid, "name": "train",
                                "owner": "alice"}, {"index": 1}]
    assert (mine["devices"], mine["used"], mine["working"], mine["utilisation"]) == (2, 1, 1, 0.5)
    assert mine["sla"]["premium"]["target"] == 0.95 and mine["sla"]["premium"]["jobs"] == 1
    theirs = logged_in(plane, bob).get("/v1/ui/cluster").json()
    assert theirs["nodes"][0]["devices"] == [{"index": 0, "tier": "premium", "state": "running", "job": None},
                                             {"index": 1}]
    assert logged_in(plane, bob).get("/v1/ui/jobs").json() == []
    (row,) = logged_in(plane, plane.user).get("/v1/ui/jobs").json()
    assert (row["id"], row["state"], row["devices"], row["nodes"]) == (jid, "running", 1, ["node-1"])
    r = logged_in(plane, bob).get(f"/v1/jobs/{jid}")
    assert r.status_code == 404 and r.json()["message"] == f"no job {jid}"


def test_the_trend_is_sampled_while_the_app_serves(plane: Plane) -> None:
    running_job(plane)
    with TestClient(plane.http.app) as c:  # its lifespan: the sampler runs
        trend: Trend = c.app.state.trend  # type: ignore[attr-defined]
        wait_until(lambda: trend.samples(), timeout=30, what="the first sample")
        c.post("/ui/login", json={"token": plane.user}, headers=UI)
        got = c.get("/v1/ui/cluster").json()
    (sample,) = got["trend"]  # the request found a sample younger than 10 s: it added none
    assert (sample["utilisation"], sample["goodput"]) == (0.5, 0.5)
    assert 0 < sample["sla"]["premium"] <= 1
    assert sample["sla"]["standard"] is None and sample["sla"]["basic"] is None
    assert sample["time"] <= got["time"]
