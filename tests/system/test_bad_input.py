"""Bad input and refused requests: 4xx naming the field, 404, 401/403, migrations that cannot happen
(the job keeps running), stale agent results ignored, and users kept apart."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tidal.testing import wait_until

pytestmark = pytest.mark.criu


def _submit(c, body: dict, who: str = "user"):  # type: ignore[no-untyped-def]
    with c.api(who) as api:
        return api.post("/v1/jobs", json=body)


def test_bad_job_specs_name_the_field(make_cluster, workdir: Path, tmp_path: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    ok = {"command": ["true"], "workdir": str(workdir)}
    cases = {
        "tier": {**ok, "tier": "gold"},
        "ranks": {**ok, "ranks": 0},
        "min_devices": {**ok, "ranks": 4, "min_devices": 3, "max_devices": 2},
        "command": {**ok, "command": []},
        "workdir": {**ok, "workdir": str(tmp_path / "missing")},
    }
    for field, body in cases.items():
        r = _submit(c, body)
        assert r.status_code == 422, (field, r.text)
        assert r.json()["field"] == field, r.json()
        assert field in r.json()["message"] or field.replace("_", " ") in r.json()["message"]
    r = _submit(c, {**ok, "ranks": "many"})
    assert r.status_code == 422 and r.json()["field"] == "ranks"
    # each of these was a 500 (or, for a rank that does not exist, a 200 with nothing)
    with c.api() as api:
        raw = {"Authorization": f"Bearer {c.token()}", "content-type": "application/json"}
        for body, field in ((f'{{"command": ["true"], "workdir": "{workdir}", "ranks": {2**70}}}', "ranks"),
                            (f'{{"command": ["true"], "workdir": "{workdir}", "name": "\\ud800"}}', "name"),
                            (f'{{"command": ["true"], "workdir": "{workdir}", "env": {{"TIDAL_TOKEN": "t"}}}}', "env")):
            r = api.post("/v1/jobs", content=body, headers=raw)
            assert r.status_code == 422 and r.json()["field"] == field, r.text
        job = _submit(c, ok).json()["id"]
        for params, field in (({"offset": -5}, "offset"), ({"rank": -1}, "rank"), ({"rank": 1}, "rank")):
            r = api.get(f"/v1/jobs/{job}/logs", params=params)
            assert r.status_code == 422 and r.json()["field"] == field, r.text
        r = api.post("/v1/jobs", content=b"[" * (2 << 20), headers=raw)
        assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"
    p = c.cli("logs", job, "--rank", "-1", check=False)
    assert p.returncode == 2 and "--rank" in p.stderr
    p = c.cli("submit", "--env", "TIDAL_TOKEN=x", "--", "true", cwd=workdir, check=False)
    assert p.returncode == 2 and "variables beginning with TIDAL_" in p.stderr, p.stderr

    # the CLI prints the message, no traceback
    p = c.cli("submit", "--tier", "gold", "--", "true", cwd=workdir, check=False)
    assert p.returncode != 0 and "unknown tier" in p.stderr and "Traceback" not in p.stderr + p.stdout
    p = c.cli("submit", "--workdir", str(tmp_path / "missing"), "--", "true", check=False)
    assert p.returncode != 0 and "workdir" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "job.yaml"
    bad.write_text("command: [unclosed\n")
    p = c.cli("submit", "-f", str(bad), check=False)
    assert p.returncode != 0 and "not valid YAML" in p.stderr and "Traceback" not in p.stderr
    good = tmp_path / "good.yaml"
    good.write_text(f"command: echo from yaml\nworkdir: {workdir}\ntier: standard\nname: y\n")
    job = c.cli("submit", "-q", "-f", str(good)).stdout.strip()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout == "from yaml\n"
    assert c.show(job)["tier"] == "standard"


def test_unknown_job_and_tokens(make_cluster) -> None:
    c = make_cluster(nodes=1, devices=1)
    with c.api() as api:
        assert api.get("/v1/jobs/nope").status_code == 404
        assert api.post("/v1/jobs/nope/preempt").status_code == 404
        assert api.post("/v1/agent/node-1/heartbeat", json={"agent_id": "x"}).status_code == 403
    p = c.cli("show", "nope", check=False)
    assert p.returncode != 0 and "no job nope" in p.stderr and "Traceback" not in p.stderr
    import httpx

    assert httpx.get(f"{c.url}/v1/jobs").status_code == 401
    with c.api(token="tdl_wrong") as api:
        assert api.get("/v1/jobs").status_code == 401
    with c.api("cluster") as api:
        assert api.get("/v1/jobs").status_code == 403
    p = c.cli("ls", env={"TIDAL_TOKEN": "tdl_wrong"}, check=False)
    assert p.returncode != 0 and "invalid API token" in p.stderr


def test_migrate_to_full_or_unknown_node_keeps_the_job_running(make_cluster, workdir: Path) -> None:
    c = make_cluster(nodes=2, devices=1)
    a = c.cli("submit", "-q", "--", "sleep", "300", cwd=workdir).stdout.strip()
    b = c.cli("submit", "-q", "--", "sleep", "300", cwd=workdir).stdout.strip()
    ja, jb = c.wait_state(a, "running"), c.wait_state(b, "running")
    other = jb["placement"][0]["node"]
    p = c.cli("migrate", a, "--to", other, check=False)
    assert p.returncode != 0 and f"node {other} has 0 free device(s)" in p.stderr
    p = c.cli("migrate", a, "--to", "node-9", check=False)
    assert p.returncode != 0 and "no node node-9" in p.stderr
    p = c.cli("migrate", a, check=False)
    assert p.returncode != 0 and "no other node" in p.stderr
    with c.api() as api:
        r = api.post(f"/v1/jobs/{a}/migrate", json={"to": "node-9"})
        assert r.status_code == 404 and r.json()["field"] == "to"
        r = api.post(f"/v1/jobs/{a}/migrate", json={"to": other})
        assert r.status_code == 409 and r.json()["field"] == "to"
    j = c.job(a)
    assert j["state"] == "running" and j["placement"] == ja["placement"]
    assert not j["checkpoints"]
    for job in (a, b):
        c.cli("cancel", job)
    # resume of a running job is a no-op; cancel of a finished job is refused
    assert c.cli("cancel", a, check=False).returncode != 0


def test_stale_agent_results_are_ignored(make_cluster, workdir: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    job = c.cli("submit", "-q", "--", "sh", "-c", "echo hi", cwd=workdir).stdout.strip()
    assert c.cli("wait", job, check=False).returncode == 0
    with c.api("cluster") as api:
        r = api.post("/v1/agent/node-1/results", json={"agent_id": "whoever", "action_id": "a-bogus",
                                                       "ok": False, "error": "late"})
        assert r.status_code == 200 and r.json()["applied"] is False
        r = api.post("/v1/agent/node-1/exits", json={"agent_id": "whoever", "job_id": job, "attempt": 1,
                                                     "ranks": [{"rank": 0, "code": 3}]})
        assert r.status_code == 409  # not the node's lease holder
    j = c.show(job)
    assert j["state"] == "succeeded" and j["exit_code"] == 0
    # the launch's result delivered again (a retry) changes nothing
    launch = next(e["cause"] for e in j["events"] if e["kind"] == "started")
    with c.api("cluster") as api:
        r = api.post("/v1/agent/node-1/results", json={"agent_id": "whoever", "action_id": launch,
                                                       "ok": False, "error": "late"})
        assert r.json()["applied"] is False
    j = c.show(job)
    assert j["state"] == "succeeded" and j["events"][-1]["kind"] == "stale_result_ignored"
    assert "stale_result_ignored" in c.cli("events", env={"TIDAL_TOKEN": c.token("admin")}).stdout


def test_users_see_only_their_own_jobs(make_cluster, workdir: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    alice = c.cli("submit", "-q", "--", "sh", "-c", "echo secret", cwd=workdir).stdout.strip()
    assert c.cli("wait", alice, check=False).returncode == 0
    with c.api("admin") as api:
        r = api.post("/v1/users", json={"name": "bob", "role": "user"})
        assert r.status_code == 201
        bob = r.json()["token"]
    with c.api("user") as api:
        assert api.post("/v1/users", json={"name": "eve"}).status_code == 403
    with c.api(token=bob) as api:
        for path in (f"/v1/jobs/{alice}", f"/v1/jobs/{alice}/logs", f"/v1/jobs/{alice}/checkpoints"):
            assert api.get(path).status_code == 404, path
        for verb in ("preempt", "resume", "cancel", "migrate"):
            assert api.post(f"/v1/jobs/{alice}/{verb}").status_code == 404, verb
        assert api.get("/v1/jobs").json() == []
        assert api.get("/v1/events", params={"job": alice}).status_code == 404
        assert all(e["job"] != alice for e in api.get("/v1/events").json())
    p = c.cli("ls", "--all", env={"TIDAL_TOKEN": bob})
    assert alice not in p.stdout
    with c.api("admin") as api:
        assert any(j["id"] == alice for j in api.get("/v1/jobs", params={"all": True}).json())

    # secrets on disk are the owner's only
    for f in (c.home / "tokens").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stat.S_IMODE((c.home / "tokens").stat().st_mode) == 0o700
    store = c.home / "checkpoints"
    if store.exists():
        assert stat.S_IMODE(store.stat().st_mode) & 0o077 == 0
    logs = c.home / "logs" / "jobs" / alice
    wait_until(lambda: logs.exists(), timeout=30, what="the served log")
    assert stat.S_IMODE(os.stat(logs / "0.log").st_mode) & 0o077 == 0
