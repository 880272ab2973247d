"""Faults of a deployment across hosts (tidal.testing.hostcluster: PostgreSQL, SeaweedFS, `tidal server
--tls auto` and joined agents, each on a test host of its own): the control plane's host killed and
restarted, PostgreSQL restarted while clients submit, the S3 store stopped while a checkpoint is requested;
and credentials across hosts (another node's, a revoked one, a server certificate the client does not trust).
Each checks what a user sees (the CLI and the API over TLS) and what the database holds, and that the
deterministic job's output is that of an uninterrupted run."""

from __future__ import annotations

import signal
import ssl
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.system.cluster import JOB, reference_run
from tidal.testing import pid_alive, wait_until
from tidal.testing.hostcluster import HostCluster
from tidal.testing.hosts import TestNet

pytestmark = [pytest.mark.criu, pytest.mark.slow, pytest.mark.postgres, pytest.mark.s3]

HOSTS = [["cp", "db", "s3", "n1", "n2"]]
# An agent that cannot renew its lease for this long fences its ranks (they must not run on where the
# control plane may restart them elsewhere). The control plane's host is down for the time `tidal server`
# takes to start again (a Python start and a database check: seconds, longer on a loaded machine), and
# PostgreSQL for its restart: the lease must outlast both, or the jobs would be stopped by their agents
# rather than keep running.
LEASE = 15.0
# How an agent exits when the control plane refuses its credential.
EXIT_REFUSED = 78
# The deterministic job of the single-machine tests, held at step 80 until GATE and again at step 120 until
# GATE2: while it waits at the first gate the test makes its fault, then opens that gate and sees the job go
# on by itself to the second. Holding prints nothing: its output is that of JOB run uninterrupted.
HOLD = '  if [ $i -ge 80 ]; then while [ ! -e "$GATE" ]; do sleep 0.05; done; fi\n'
assert HOLD in JOB
TWO_GATES = JOB.replace(HOLD, HOLD + HOLD.replace("80", "120").replace("$GATE", "$GATE2"))


def _progress(workdir: Path) -> int:
    p = workdir / "progress.txt"
    return len(p.read_text().split()) if p.exists() else 0


def _job_dir(net: TestNet, name: str) -> Path:
    d = net.shared / name
    d.mkdir()
    return d


def _rows(cluster: HostCluster) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What PostgreSQL holds: every job (id, state, attempt, name) and every checkpoint (id, job, state)."""
    engine = create_engine(cluster.database_url)
    try:
        with engine.connect() as conn:
            jobs = [tuple(r) for r in conn.execute(text("SELECT id, state, attempt, name FROM jobs ORDER BY id"))]
            cks = [tuple(r) for r in conn.execute(text("SELECT id, job_id, state FROM checkpoints ORDER BY id"))]
    finally:
        engine.dispose()
    return jobs, cks


def _checkpoints(cluster: HostCluster, job: str) -> list[tuple[str, str]]:
    with cluster.api() as c:
        r = c.get(f"/v1/jobs/{job}/checkpoints")
    assert r.status_code == 200, r.text
    return [(x["id"], x["state"]) for x in r.json()]


@pytest.mark.parametrize("test_net", HOSTS, indirect=True)
def test_control_plane_host_killed_and_restarted(test_net: TestNet, tmp_path: Path) -> None:
    net = test_net
    cluster = HostCluster(net, nodes=["n1", "n2"], lease=LEASE, devices=2)
    expected_out, expected_progress = reference_run(tmp_path)
    gate, gate2 = net.shared / "gate", net.shared / "gate2"
    work = {k: _job_dir(net, f"work-{k}") for k in ("a", "b")}
    jobs = {k: cluster.submit(["sh", "-c", TWO_GATES], cwd=work[k],
                              options=["--env", f"GATE={gate}", "--env", f"GATE2={gate2}"]) for k in work}
    first = cluster.running_on(jobs["a"])
    cluster.cli("migrate", jobs["a"])  # a checkpoint in the store and in the database
    placed = {k: cluster.running_on(j) for k, j in jobs.items()}
    assert placed["a"][0][0] != first[0][0]
    assert [s for _, s in _checkpoints(cluster, jobs["a"])] == ["committed"]
    wait_until(lambda: all(_progress(w) == 80 for w in work.values()), timeout=30, what="the jobs at step 80")
    before = {k: cluster.job(j) for k, j in jobs.items()}
    rows_before = _rows(cluster)
    with cluster.api(cluster.admin_token) as c:
        events_before = [e["id"] for e in c.get("/v1/events").json()]

    cluster.kill_server(signal.SIGKILL)  # its host fails
    gate.touch()
    wait_until(lambda: all(_progress(w) == 120 for w in work.values()), timeout=30,
               what="the jobs to go on without the control plane")
    down = cluster.cli("ls", check=False)
    assert down.returncode != 0 and "cannot reach the control plane" in down.stderr + down.stdout

    cluster.start_server()
    diag = cluster.diagnostics
    for k, j in jobs.items():
        after = cluster.job(j)
        assert after["state"] == "running" and after["attempt"] == before[k]["attempt"], diag()
        assert cluster.running_on(j) == placed[k], f"job {k} was moved or restarted\n{diag()}"
        assert after["checkpoints"] == before[k]["checkpoints"]
        assert [e["id"] for e in after["events"]][: len(before[k]["events"])] == \
            [e["id"] for e in before[k]["events"]]
    assert all(pid_alive(pid) for p in placed.values() for _, pid in p.values())
    assert _rows(cluster) == rows_before, diag()
    with cluster.api(cluster.admin_token) as c:
        events_after = c.get("/v1/events").json()
    assert [e["id"] for e in events_after][: len(events_before)] == events_before
    assert [e["kind"] for e in events_after[len(events_before):]].count("control_plane_started") == 1

    # A new submission after the restart runs (the agents reconnected and take its orders).
    late = cluster.submit(["sh", "-c", "echo after the restart"], cwd=_job_dir(net, "work-late"))
    cluster.wait_state(late, "succeeded")
    assert cluster.cli("logs", late).stdout == "after the restart\n"

    gate2.touch()
    for k, j in jobs.items():
        assert cluster.cli("wait", j, check=False).returncode == 0, diag()
        assert cluster.cli("logs", j).stdout.encode() == expected_out
        assert (work[k] / "progress.txt").read_bytes() == expected_progress
        assert not any(pid_alive(pid) for _, pid in placed[k].values())


@dataclass
class Outcomes:
    """What each submission of the load got back: its name -> the job id (201), or the error answered."""

    ok: dict[str, str] = field(default_factory=dict)
    refused: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _submit_until(cluster: HostCluster, who: int, workdir: Path, out: Outcomes, stop: threading.Event) -> None:
    """Submit jobs named load-WHO-N one after another until ``stop``, noting each answer."""
    n = 0
    with cluster.api(timeout=60) as c:
        while not stop.is_set():
            name = f"load-{who}-{n}"
            n += 1
            try:
                r = c.post("/v1/jobs", json={"command": ["true"], "workdir": str(workdir), "name": name})
            except httpx.HTTPError as exc:  # no answer at all: what must not happen
                with out.lock:
                    out.refused[name] = (0, {"error": repr(exc)})
                continue
            with out.lock:
                if r.status_code == 201:
                    out.ok[name] = r.json()["id"]
                else:
                    try:
                        body = r.json()
                    except ValueError:
                        body = {"text": r.text}
                    out.refused[name] = (r.status_code, body)
            stop.wait(0.02)


@pytest.mark.parametrize("test_net", HOSTS, indirect=True)
def test_postgres_restarted_while_clients_submit(test_net: TestNet) -> None:
    net = test_net
    cluster = HostCluster(net, nodes=["n1", "n2"], lease=LEASE, devices=1)
    diag = cluster.diagnostics
    # Two jobs take both devices, so that the load's jobs queue (and the scheduler looks at them each pass).
    gate = net.shared / "gate"
    blockers = [cluster.submit(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"],
                               cwd=_job_dir(net, f"block-{i}")) for i in range(2)]
    pids = {j: cluster.running_on(j) for j in blockers}
    load = _job_dir(net, "load")

    out, stop = Outcomes(), threading.Event()
    clients = [threading.Thread(target=_submit_until, args=(cluster, k, load, out, stop), daemon=True)
               for k in range(4)]
    refused: dict[str, int] = {}  # restart -> how many submissions it made fail
    for t in clients:
        t.start()
    try:
        wait_until(lambda: len(out.ok) >= 20, timeout=60, what="submissions before the restarts")
        # A clean restart (its clients are disconnected), then one as after a crash (recovery from the WAL).
        modes: tuple[Literal["fast", "immediate"], ...] = ("fast", "immediate")
        for mode in modes:
            failed_before = len(out.refused)
            cluster.postgres.restart(mode)
            ok_after = len(out.ok)
            wait_until(lambda: len(out.ok) >= ok_after + 20, timeout=60,  # noqa: B023 (waited on at once)
                       what=f"submissions to succeed again after the {mode} restart "
                            f"(the last refused: {list(out.refused.values())[-3:]})")
            refused[mode] = len(out.refused) - failed_before
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    assert not any(t.is_alive() for t in clients)

    assert all(refused.values()), f"a restart met no submission: it proves nothing ({refused})"
    for name, (status, body) in out.refused.items():
        assert status == 503 and body["error"] == "Unavailable", f"{name}: {status} {body}\n{diag()}"
        assert "database" in body["message"], body
    # Each job exists once, and exactly those whose submission succeeded. A submission refused "in doubt"
    # (the connection was lost at the COMMIT itself) may have been made: the client was told so.
    jobs, _ = _rows(cluster)
    names = Counter(name for _, _, _, name in jobs if name.startswith("load-"))
    assert all(n == 1 for n in names.values()), [k for k, n in names.items() if n > 1]
    made = {name: i for i, _, _, name in jobs if name.startswith("load-")}
    assert {n: made.get(n) for n in out.ok} == out.ok, diag()
    in_doubt = {n for n, (_, body) in out.refused.items() if body.get("in_doubt")}
    assert set(made) - set(out.ok) <= in_doubt, diag()
    for j, placed in pids.items():
        assert cluster.running_on(j) == placed, diag()  # untouched: their agents kept the lease
    # The control plane goes on: a job still runs to its end.
    gate.touch()
    for j in blockers:
        cluster.wait_state(j, "succeeded")


@pytest.mark.parametrize("test_net", HOSTS, indirect=True)
def test_s3_store_stopped_during_a_checkpoint(test_net: TestNet, tmp_path: Path) -> None:
    net = test_net
    cluster = HostCluster(net, nodes=["n1", "n2"], lease=LEASE, devices=1)
    diag = cluster.diagnostics
    expected_out, expected_progress = reference_run(tmp_path)
    gate, gate2 = net.shared / "gate", net.shared / "gate2"
    work = _job_dir(net, "work")
    job = cluster.submit(["sh", "-c", TWO_GATES], cwd=work,
                         options=["--env", f"GATE={gate}", "--env", f"GATE2={gate2}"])
    ((first_node, first_pid),) = cluster.running_on(job).values()
    wait_until(lambda: _progress(work) >= 3, timeout=30, what="progress")
    cluster.cli("migrate", job)  # a checkpoint committed to the store, restored on the other host
    ((node, pid),) = cluster.running_on(job).values()
    assert node != first_node and not pid_alive(first_pid)
    (committed,) = _checkpoints(cluster, job)
    assert committed[1] == "committed"
    wait_until(lambda: _progress(work) == 80, timeout=30, what="the job at step 80")

    cluster.s3.shutdown(kill=True)  # the store's host fails
    seq = cluster.job(job)["events"][-1]["seq"]
    refused = cluster.cli("preempt", job, check=False)
    assert refused.returncode != 0, f"{refused.stdout}\n{diag()}"
    said = " ".join((refused.stdout + refused.stderr).split())
    assert f"job {job} could not be preempted: hold checkpoint failed, the job goes on" in said, said
    assert "checkpoint store error" in said and "its last good checkpoint is untouched" in said, said
    j = cluster.wait_state(job, "running")
    failed = [e for e in j["events"] if e["seq"] > seq and "checkpoint failed" in e["detail"]]
    assert failed and "checkpoint store error" in failed[-1]["detail"], (failed, diag())
    assert cluster.running_on(job) == {0: (node, pid)}, diag()  # the job went on where it was
    assert pid_alive(pid)
    assert _checkpoints(cluster, job) == [committed]  # nothing half-made is listed; the last one stays
    gate.touch()
    wait_until(lambda: _progress(work) == 120, timeout=30, what="the job to go on after the failed checkpoint")

    cluster.s3.start()
    cluster.cli("migrate", job)  # a checkpoint again, restored from the store on the first host
    ((node2, pid2),) = cluster.running_on(job).values()
    assert node2 == first_node and not pid_alive(pid)
    listed = _checkpoints(cluster, job)
    assert listed[0] == committed and [s for _, s in listed] == ["committed", "committed"], listed

    gate2.touch()
    assert cluster.cli("wait", job, check=False).returncode == 0, diag()
    assert cluster.cli("logs", job).stdout.encode() == expected_out
    assert (work / "progress.txt").read_bytes() == expected_progress
    assert not pid_alive(pid2)


@pytest.mark.parametrize("test_net", HOSTS, indirect=True)
def test_credentials_across_hosts(test_net: TestNet) -> None:
    net = test_net
    cluster = HostCluster(net, nodes=["n1", "n2"], lease=LEASE, devices=1)
    diag = cluster.diagnostics
    job = cluster.submit(["sleep", "600"], cwd=_job_dir(net, "work"))
    ((node, pid),) = cluster.running_on(job).values()
    other = "n2" if node == "n1" else "n1"
    credential = {n: (a.root / "agent.token").read_text().strip() for n, a in cluster.agents.items()}

    def register(name: str, token: str) -> tuple[int, dict[str, Any]]:
        """Register as node ``name`` with ``token``, as an agent on the host of node ``other`` would."""
        def call() -> tuple[int, dict[str, Any]]:
            with httpx.Client(base_url=cluster.url, verify=ssl.create_default_context(cafile=cluster.ca),
                              timeout=30) as c:
                r = c.post("/v1/agent/register", headers={"Authorization": f"Bearer {token}"},
                           json={"agent_id": "intruder", "name": name, "devices": 1, "cpus": [[0]]})
            return r.status_code, r.json()

        return net[other].call(call)

    # Another node's credential, presented from that node's host, is refused for this node.
    status, body = register(node, credential[other])
    assert status == 403 and body["message"] == f"this credential is node {other}'s: it cannot act for node {node}"

    # A client that does not trust the server's certificate refuses to talk to it.
    p = cluster.cli("ls", check=False, env={"TIDAL_CA": ""})
    said = " ".join(p.stderr.split())
    assert p.returncode == 1 and f"refusing to talk to the control plane at {cluster.url}: its certificate is " \
        "not trusted" in said, p.stderr

    # A revoked credential: the node's agent is refused at its next call; it stops its ranks and exits.
    assert f"revoked node {node}'s credential" in cluster.cli("token", "revoke", node, token=cluster.admin_token).stdout
    agent = cluster.agents[node].proc
    assert agent is not None
    assert agent.wait(3 * LEASE) == EXIT_REFUSED, diag()
    wait_until(lambda: not pid_alive(pid), timeout=30, what="the revoked node's rank to be killed")
    status, body = register(node, credential[node])
    assert status == 401 and "revoked" in body["message"], body
    assert cluster.agents[other].proc is not None and cluster.agents[other].proc.poll() is None  # untouched
