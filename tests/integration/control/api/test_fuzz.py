"""The API under bad input: every malformed, out-of-range or oversized request is a 4xx that names the
field (a 413 for a body over its route's limit), never a 500 nor an allocation without end; a node's
registration is bounded and bound to its credential. Hypothesis draws the bodies for every route."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from tidal.control import tokens
from tidal.control.server import recover
from tidal.control.store.models import EventRow, NodeRow
from tidal.core import limits
from tidal.testing.control import FakeAgent, Plane, start
from tidal.testing.server import served


def raw(p: Plane, method: str, path: str, body: Any, headers: dict[str, str], **kw: Any) -> httpx.Response:
    """JSON as a client may send it: with lone surrogates (as escapes), NaN and huge numbers."""
    return p.http.request(method, path, content=json.dumps(body), **kw,
                          headers={**headers, "content-type": "application/json"})


def refused(r: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body.get("field") == field, body
    return body


# -- item 7: each of these was a 500, or a 200 with nothing --------------------------------------------------
def test_bad_job_input_is_a_422_naming_the_field(plane: Plane) -> None:
    ok = {"command": ["train"], "workdir": str(plane.workdir)}
    user = plane.as_user()
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "ranks": 2**70}, user), 422, "ranks")
    body = refused(raw(plane, "POST", "/v1/jobs", {**ok, "name": "a\ud800b"}, user), 422, "name")
    assert "lone surrogate" in body["message"]
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "project": "\udfff"}, user), 422, "project")
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "command": ["py", "\ud800"]}, user), 422, "command")
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "command": ["a\x00b"]}, user), 422, "command")
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "max_restarts": 2**70}, user), 422, "max_restarts")
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "min_devices": -(2**70)}, user), 422, "min_devices")
    refused(raw(plane, "POST", "/v1/jobs", {**ok, "name": "n" * (limits.MAX_NAME_CHARS + 1)}, user), 422, "name")
    r = plane.http.post("/v1/jobs", headers={**user, "content-type": "application/json"},
                        content=json.dumps({**ok, "checkpoint_every": 1e999}))
    refused(r, 422, "checkpoint_every")

    jid = plane.submit()
    for params, field in (({"offset": -5}, "offset"), ({"rank": -1}, "rank"), ({"rank": 1}, "rank"),
                          ({"offset": 2**70}, "offset")):
        refused(plane.http.get(f"/v1/jobs/{jid}/logs", headers=user, params=params), 422, field)
    for params, field in (({"limit": 0}, "limit"), ({"limit": limits.MAX_PAGE + 1}, "limit"),
                          ({"last": -1}, "last"), ({"after": -1}, "after"), ({"after": 2**70}, "after")):
        refused(plane.http.get("/v1/events", headers=user, params=params), 422, field)
    refused(plane.http.get("/v1/jobs", headers=user, params={"limit": 10**12}), 422, "limit")


def test_job_env_is_checked(plane: Plane) -> None:
    ok = {"command": ["train"], "workdir": str(plane.workdir)}
    user = plane.as_user()
    for name in ("TIDAL_TOKEN", "TIDAL_HOME", "tidal_database_url"):
        body = refused(raw(plane, "POST", "/v1/jobs", {**ok, "env": {"PATH": "/bin", name: "x"}}, user),
                       422, "env")
        assert body["variable"] == name and name in body["message"] and "Tidal's own" in body["message"]
    cases: list[tuple[dict[str, str], str]] = [
        ({"": "x"}, "not a variable name"), ({"A=B": "x"}, "not a variable name"),
        ({"A\x00": "x"}, "not a variable name"), ({"A": "x\x00y"}, "NUL"),
        ({"\ud800": "x"}, "lone surrogate"), ({"A": "\udfff"}, "lone surrogate"),
        ({"N" * (limits.MAX_ENV_NAME_BYTES + 1): "x"}, "the name is over"),
        ({"A": "v" * (limits.MAX_ENV_VALUE_BYTES + 1)}, "the value is"),
        ({f"V{i}": "x" * 60_000 for i in range(5)}, "bytes in all"),
        ({f"V{i}": "" for i in range(limits.MAX_ENV_VARS + 1)}, "variables, more than"),
    ]
    for env, what in cases:
        body = refused(raw(plane, "POST", "/v1/jobs", {**ok, "env": env}, user), 422, "env")
        assert what in body["message"], body
    # The dynamic loader's variables are the job owner's business: the ranks' command runs as the owner.
    jid = plane.submit(env={"LD_PRELOAD": "/opt/lib/x.so", "LD_LIBRARY_PATH": "/opt/lib", "MY_TIDAL": "1"})
    with plane.db.read() as s:
        from tidal.control.store.models import JobRow

        job = s.get(JobRow, jid)
        assert job is not None
        assert job.spec["env"] == {"LD_PRELOAD": "/opt/lib/x.so", "LD_LIBRARY_PATH": "/opt/lib", "MY_TIDAL": "1"}


def test_user_creation_input(plane: Plane) -> None:
    with plane.db.tx() as s:
        admin = {"Authorization": f"Bearer {tokens.create_user(s, 'root', 'admin')}"}
    refused(plane.http.post("/v1/users", headers=admin, json={"name": "x" * 65}), 422, "name")
    refused(raw(plane, "POST", "/v1/users", {"name": "\ud800"}, admin), 422, "name")
    refused(plane.http.post("/v1/users", headers=admin, json={"name": "bob", "unix_user": "a\x00b"}),
            422, "unix_user")


# -- item 6: a node cannot take the control plane down ------------------------------------------------------
def test_registrations_are_bounded_and_nothing_is_kept_of_a_refused_one(plane: Plane) -> None:
    agent = plane.as_agent()

    def register(**kw: Any) -> httpx.Response:
        body = {"name": "node-x", "agent_id": "A", "devices": 1, "cpus": [[0]], **kw}
        return raw(plane, "POST", "/v1/agent/register", body, agent)

    refused(register(devices=335214574), 422, "devices")
    refused(register(devices=0, cpus=[]), 422, "devices")
    refused(register(devices=2, cpus=[[0]]), 422, "cpus")
    refused(register(devices=1, cpus=[[]]), 422, "cpus")
    refused(register(devices=1, cpus=[[0, 0]]), 422, "cpus")
    refused(register(devices=1, cpus=[[limits.MAX_CPU_ID + 1]]), 422, "cpus")
    refused(register(devices=1, cpus=[[-1]]), 422, "cpus")
    for bad in ("../etc", "", "n" * (limits.MAX_NODE_NAME_CHARS + 1), "node\ud800", "a b"):
        refused(register(name=bad), 422, "name")
    refused(register(agent_id="x" * 65), 422, "agent_id")
    refused(register(region="r/1"), 422, "region")
    with plane.db.read() as s:
        assert list(s.scalars(select(NodeRow))) == []
    assert register(devices=2, cpus=[[0], [1]]).status_code == 200


def test_the_cluster_size_is_bounded(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_NODES", 2)
    monkeypatch.setattr(limits, "MAX_CLUSTER_DEVICES", 3)
    assert FakeAgent(plane, "node-1", "A").register() == 200
    r = plane.http.post("/v1/agent/register", headers=plane.as_agent(), json={
        "name": "node-2", "agent_id": "B", "devices": 3, "cpus": [[0], [1], [2]]})
    refused(r, 409, "devices")
    assert FakeAgent(plane, "node-2", "B").register() == 200
    assert FakeAgent(plane, "node-1", "A").register() == 200  # a known node registers again
    r = plane.http.post("/v1/agent/register", headers=plane.as_agent(), json={
        "name": "node-3", "agent_id": "C", "devices": 1, "cpus": [[0]]})
    refused(r, 409, "name")


def test_a_node_credential_acts_for_its_node_only(plane: Plane) -> None:
    with plane.db.tx() as s:
        own = {"Authorization": f"Bearer {tokens.create_user(s, 'node-7', 'agent')}"}
    body = {"agent_id": "A", "devices": 1, "cpus": [[0]]}
    refused(plane.http.post("/v1/agent/register", headers=own, json={**body, "name": "node-8"}), 403, "node")
    assert plane.http.post("/v1/agent/register", headers=own, json={**body, "name": "node-7"}).status_code == 200
    assert FakeAgent(plane, "node-8", "B").register() == 200  # the cluster credential: any node
    refused(plane.http.post("/v1/agent/node-8/heartbeat", headers=own, json={"agent_id": "B"}), 403, "node")
    refused(plane.http.post("/v1/agent/node-8/leave", headers=own, json={"agent_id": "B"}), 403, "node")
    refused(plane.http.get("/v1/agent/node-8/actions", headers=own, params={"agent_id": "B"}), 403, "node")
    assert plane.http.post("/v1/agent/node-7/heartbeat", headers=own, json={"agent_id": "A"}).status_code == 200
    with plane.db.read() as s:
        node8 = s.get(NodeRow, "node-8")
        assert node8 is not None and node8.up


def test_a_node_registered_over_the_limits_is_taken_down_at_start(plane: Plane) -> None:
    assert FakeAgent(plane, "node-1", "B").register() == 200
    with plane.db.tx() as s:  # as an older control plane let it in
        s.add(NodeRow(name="bogus", region="local", cluster="local", devices=335214574, cpus=[], agent_id="A",
                      lease_until=time.time() + 60, up=True, registered_at=time.time()))
    recover(plane.db, 5.0)
    with plane.db.read() as s:
        bogus, fine = s.get(NodeRow, "bogus"), s.get(NodeRow, "node-1")
        assert bogus is not None and not bogus.up and fine is not None and fine.up
        down = s.scalars(select(EventRow).where(EventRow.kind == "node_down", EventRow.node == "bogus")).one()
        assert "335214574 device(s)" in down.detail
    nodes = plane.http.get("/v1/nodes", headers=plane.as_user()).json()
    assert [(n["name"], n["free"]) for n in nodes] == [("bogus", 0), ("node-1", 1)]


def test_heartbeats_and_reports_are_bounded(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    FakeAgent(plane, "node-2", "B").register()
    jid = plane.submit()
    start(plane, a, jid)
    agent = plane.as_agent()
    many = {f"j{i}": {"attempt": 1.0} for i in range(limits.MAX_HEARTBEAT_JOBS + 1)}
    refused(plane.http.post("/v1/agent/node-1/heartbeat", headers=agent, json={"agent_id": "A", "jobs": many}),
            422, "jobs")
    figures = {f"f{i}": 1.0 for i in range(limits.MAX_PROGRESS_FIGURES + 1)}
    r = plane.http.post("/v1/agent/node-1/heartbeat", headers=agent, json={"agent_id": "A", "jobs": {jid: figures}})
    refused(r, 422, f"jobs.{jid}")
    # A figure that is not a finite number is left out (a refused heartbeat would cost the lease).
    r = plane.http.post("/v1/agent/node-1/heartbeat", headers={**agent, "content-type": "application/json"},
                        content=f'{{"agent_id": "A", "jobs": {{"{jid}": {{"attempt": 1, "cpu_s": NaN, '
                                f'"rss_bytes": Infinity, "output_bytes": 5}}}}}}')
    assert r.status_code == 200, r.text
    progress = plane.job(jid)["progress"]
    assert progress["output_bytes"] == 5 and progress["cpu_s"] == 0 and progress["nodes"] == {
        "node-1": {"output_bytes": 5.0}}
    # Another node's figures do not land in this job's progress.
    r = plane.http.post("/v1/agent/node-2/heartbeat", headers=agent, json={
        "agent_id": "B", "jobs": {jid: {"attempt": 1, "output_bytes": 99}}})
    assert r.status_code == 200
    assert plane.job(jid)["progress"]["nodes"] == {"node-1": {"output_bytes": 5.0}}

    def exits(ranks: list[dict[str, Any]]) -> httpx.Response:
        return raw(plane, "POST", "/v1/agent/node-1/exits", {"agent_id": "A", "job_id": jid, "attempt": 1,
                                                            "ranks": ranks}, agent)

    refused(exits([{"rank": 1, "code": 0}]), 422, "ranks")
    refused(exits([{"rank": 0, "code": 2**40}]), 422, "ranks.0.code")
    refused(exits([{"rank": 0, "code": 0, "at": float("nan")}]), 422, "ranks.0.at")
    refused(exits([{"rank": 0, "code": 0}] * (limits.MAX_RANKS + 1)), 422, "ranks")

    def put(rank: int, offset: int) -> httpx.Response:
        return plane.http.put(f"/v1/agent/node-1/logs/{jid}/{rank}", headers=agent, content=b"x",
                              params={"agent_id": "A", "attempt": 1, "offset": offset})

    refused(put(0, -1), 422, "offset")
    refused(put(0, limits.MAX_LOG_OFFSET + 1), 422, "offset")
    refused(put(-1, 0), 422, "rank")
    refused(put(1, 0), 422, "rank")
    assert not (plane.workdir / "logs" / "jobs" / jid / "1.log").exists()
    # An agent's error text with an undecodable file name in it is kept, escaped.
    act = _checkpoint_action(plane, jid)
    r = raw(plane, "POST", "/v1/agent/node-1/results",
            {"agent_id": "A", "action_id": act["id"], "ok": False, "error": "no file \udcff"}, agent)
    assert r.status_code == 200 and r.json()["applied"] is True
    assert "no file \\udcff" in plane.job(jid)["events"][-1]["detail"]


def _checkpoint_action(plane: Plane, jid: str) -> dict[str, Any]:
    assert plane.http.post(f"/v1/jobs/{jid}/preempt", headers=plane.as_user()).status_code == 200
    (act,) = FakeAgent(plane, "node-1", "A").actions()
    return act


def test_a_log_read_is_bounded(plane: Plane) -> None:
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)
    data = bytes(range(256)) * ((limits.MAX_LOG_READ_BYTES + 1000) // 256)
    for off in range(0, len(data), limits.MAX_LOG_UPLOAD_BYTES):
        r = plane.http.put(f"/v1/agent/node-1/logs/{jid}/0", headers=plane.as_agent(),
                           content=data[off:off + limits.MAX_LOG_UPLOAD_BYTES],
                           params={"agent_id": "A", "attempt": 1, "offset": off})
        assert r.json()["applied"] is True
    r = plane.http.get(f"/v1/jobs/{jid}/logs", headers=plane.as_user())
    assert len(r.content) == limits.MAX_LOG_READ_BYTES and r.headers["X-Tidal-Log-Size"] == str(len(data))
    r = plane.http.get(f"/v1/jobs/{jid}/logs", headers=plane.as_user(), params={"offset": len(r.content)})
    assert r.content == data[limits.MAX_LOG_READ_BYTES:]


def test_a_job_shows_its_latest_events(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_JOB_EVENTS_SHOWN", 3)
    jid = plane.submit()
    for _ in range(4):
        for verb in ("preempt", "resume"):
            plane.http.post(f"/v1/jobs/{jid}/{verb}", headers=plane.as_user())
    with plane.db.read() as s:
        seqs = [e.seq for e in s.scalars(select(EventRow).where(EventRow.job_id == jid).order_by(EventRow.seq))]
    assert len(seqs) > 3
    assert [e["seq"] for e in plane.job(jid)["events"]] == seqs[-3:]


# -- request bodies ----------------------------------------------------------------------------------------------
ROUTES = [("POST", "/v1/jobs"), ("POST", "/v1/users"), ("POST", "/v1/jobs/j/migrate"),
          ("POST", "/v1/jobs/j/resize"), ("POST", "/v1/agent/register"), ("POST", "/v1/agent/node-1/heartbeat"),
          ("POST", "/v1/agent/node-1/results"), ("POST", "/v1/agent/node-1/exits"),
          ("POST", "/v1/agent/node-1/leave"), ("GET", "/v1/jobs"), ("GET", "/healthz")]


def _too_large(r: httpx.Response, limit: int) -> None:
    assert r.status_code == 413, r.text[:200]
    assert r.json()["error"] == "PayloadTooLarge" and r.json()["limit"] == limit


def test_bodies_over_the_limit_are_refused_on_every_route(plane: Plane) -> None:
    big = b"x" * (limits.MAX_BODY_BYTES + 1)
    for method, path in ROUTES:
        headers = plane.as_user()
        _too_large(plane.http.request(method, path, headers=headers, content=big), limits.MAX_BODY_BYTES)
        # streamed (chunked, no Content-Length): counted as it arrives
        chunks = iter([b"{" + b" " * (64 << 10)] * 17)
        _too_large(plane.http.request(method, path, headers=headers, content=chunks), limits.MAX_BODY_BYTES)
        # a Content-Length that understates the body is not believed
        r = plane.http.request(method, path, headers={**headers, "content-length": "2"}, content=big)
        _too_large(r, limits.MAX_BODY_BYTES)
    # a log chunk may be larger, up to its own limit
    a = FakeAgent(plane, "node-1", "A")
    a.register()
    jid = plane.submit()
    start(plane, a, jid)
    url = f"/v1/agent/node-1/logs/{jid}/0"
    params = {"agent_id": "A", "attempt": 1, "offset": 0}
    r = plane.http.put(url, headers=plane.as_agent(), params=params, content=big)
    assert r.status_code == 200 and r.json()["applied"] is True
    r = plane.http.put(url, headers=plane.as_agent(), params=params, content=b"y" * (limits.MAX_LOG_UPLOAD_BYTES + 1))
    _too_large(r, limits.MAX_LOG_UPLOAD_BYTES)
    assert plane.http.get(f"/v1/jobs/{jid}/logs", headers=plane.as_user()).content == big


def test_a_real_server_refuses_large_bodies_with_a_413(plane: Plane) -> None:
    with served(plane.http.app) as url, httpx.Client(base_url=url, headers=plane.as_user(), timeout=30) as http:
        big = b"{" + b" " * (2 * limits.MAX_BODY_BYTES)
        _too_large(http.post("/v1/jobs", content=big), limits.MAX_BODY_BYTES)
        _too_large(http.post("/v1/jobs", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)])),
                   limits.MAX_BODY_BYTES)
        r = http.post("/v1/jobs", json={"command": ["train"], "workdir": str(plane.workdir)})
        assert r.status_code == 201, r.text


# -- fuzz: whatever the body, never a 500 -----------------------------------------------------------------------
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([2**63, 2**70, -(2**70), 335214574]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["\ud800", "a\udfffb", "\x00", "TIDAL_TOKEN", "node-1", "/", "../x"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8) | st.sampled_from(["\ud800", "TIDAL_HOME", "rank"]), inner, max_size=4), max_leaves=12)

FIELDS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "/v1/jobs": ({"command": ["train"], "workdir": "WORKDIR"},
                 ["command", "workdir", "name", "tier", "ranks", "min_devices", "max_devices", "env",
                  "checkpoint_every", "max_restarts", "project"]),
    "/v1/users": ({"name": "bob"}, ["name", "role", "unix_user"]),
    "/v1/jobs/JOB/migrate": ({}, ["to", "rank"]),
    "/v1/jobs/JOB/resize": ({"devices": 1}, ["devices"]),
    "/v1/agent/register": ({"name": "node-9", "agent_id": "Z", "devices": 1, "cpus": [[0]]},
                           ["name", "agent_id", "region", "cluster", "devices", "cpus"]),
    "/v1/agent/node-1/heartbeat": ({"agent_id": "A", "jobs": {}}, ["agent_id", "jobs"]),
    "/v1/agent/node-1/results": ({"agent_id": "A", "action_id": "a-1", "ok": True},
                                 ["agent_id", "action_id", "ok", "error", "data"]),
    "/v1/agent/node-1/exits": ({"agent_id": "A", "job_id": "JOB", "attempt": 1, "ranks": [{"rank": 0}]},
                               ["agent_id", "job_id", "attempt", "ranks"]),
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, Any]:
    path = draw(st.sampled_from(sorted(FIELDS)))
    base, fields = FIELDS[path]
    if draw(st.integers(0, 9)) == 0:
        return path, draw(VALUES)  # not even an object
    body = dict(base)
    for field in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
        body[field] = draw(VALUES)
    return path, body


@dataclass
class Fuzzed:
    plane: Plane
    job: str  # a running job of one rank on node-1
    admin: dict[str, str]

    def who(self, path: str) -> dict[str, str]:
        if "/agent/" in path:
            return self.plane.as_agent()
        return self.admin if path == "/v1/users" else self.plane.as_user()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    p = Plane(tmp_path_factory.mktemp("fuzz"))
    a = FakeAgent(p, "node-1", "A")
    a.register()
    jid = p.submit(ranks=1)
    start(p, a, jid)
    with p.db.tx() as s:
        admin = {"Authorization": f"Bearer {tokens.create_user(s, 'root', 'admin')}"}
    yield Fuzzed(p, jid, admin)
    p.db.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests())
def test_fuzzed_bodies_never_make_a_server_error(fuzzed: Fuzzed, req: tuple[str, Any]) -> None:
    p, jid = fuzzed.plane, fuzzed.job
    path, body = req
    path = path.replace("JOB", jid)
    if isinstance(body, dict):
        body = {k: (str(p.workdir) if v == "WORKDIR" else jid if v == "JOB" else v) for k, v in body.items()}
    r = raw(p, "POST", path, body, fuzzed.who(path))  # the test client raises a server error: it fails here
    assert r.status_code < 500, (path, body, r.text)
    if r.status_code >= 400:
        err = r.json()
        assert err["error"] and err["message"]
        if r.status_code == 422 and isinstance(body, dict):
            assert err.get("field"), err


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["/v1/jobs/JOB/logs", "/v1/events", "/v1/jobs", "/v1/agent/node-1/actions"]),
       st.dictionaries(st.sampled_from(["rank", "offset", "limit", "after", "last", "wait", "agent_id", "job"]),
                       st.integers().map(str) | st.sampled_from(["-5", "1e9", "nan", "inf", str(2**70), "", "x"]),
                       max_size=4))
def test_fuzzed_queries_never_make_a_server_error(fuzzed: Fuzzed, path: str, params: dict[str, str]) -> None:
    if path.endswith("/actions"):
        params = {"agent_id": "A", **params}
        if _valid_wait(params.get("wait", "0")):
            params["wait"] = "0"  # a valid wait holds the long-poll open: keep the fuzz quick
    r = fuzzed.plane.http.get(path.replace("JOB", fuzzed.job), headers=fuzzed.who(path), params=params)
    assert r.status_code < 500, (path, params, r.text)
    if r.status_code == 422:
        assert r.json()["field"] in params, r.json()


def _valid_wait(text: str) -> bool:
    try:
        return 0 <= float(text) <= limits.MAX_POLL_WAIT_S
    except ValueError:
        return False


def test_agents_send_log_chunks_within_the_upload_limit() -> None:
    from tidal.agent import executor

    assert executor.CHUNK <= limits.MAX_LOG_UPLOAD_BYTES
