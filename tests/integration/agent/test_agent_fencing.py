"""A real agent process cut off from a real control plane (served over HTTP on loopback, with its reconcile
loop): the agent fences itself — its ranks are dead, and it says so — before the control plane's lease
for the node runs out and the node's job is requeued; once the control plane can be reached again the
agent registers as a new agent, the job is restored there from its last checkpoint and runs to the end
once: its output is that of an uninterrupted run.

The partition is a stopped relay between the agent and the control plane: connections are accepted by the
kernel and nothing more happens, as when packets are dropped, so the agent's requests hang until they time
out rather than fail at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from tidal.control.store.models import EventRow, NodeRow
from tidal.mechanisms.criu.tasks import descendants
from tidal.testing import pid_alive, wait_until
from tidal.testing.control import Plane
from tidal.testing.relay import Relay
from tidal.testing.server import served

pytestmark = pytest.mark.criu

# The agent fences max(0.5, 6 / 4) = 1.5 s before the control plane may requeue: ample room to see its
# ranks dead while the node is still up, also on a busy machine.
LEASE = 6.0

# Numbered steps to a file and to the output; at step HOLD it waits for the gate (outside its working
# directory, which a restore rolls back), so that it is still running when the link goes down.
JOB = r"""
i=0
while [ $i -lt 40 ]; do
  i=$((i+1))
  echo "step $i"
  echo "$i" >> progress.txt
  if [ $i -ge 20 ]; then while [ ! -e "$GATE" ]; do sleep 0.05; done; fi
  sleep 0.02
done
echo done
"""


@pytest.fixture
def plane(tmp_path: Path, criu: object) -> Iterator[Plane]:
    home = tmp_path / "control"
    home.mkdir()
    p = Plane(home, lease_s=LEASE)
    p.rec.start()
    yield p
    p.rec.stop()
    p.db.close()


def _steps(work: Path) -> int:
    try:
        return len((work / "progress.txt").read_text().split())
    except FileNotFoundError:
        return 0


def _node(plane: Plane, name: str) -> NodeRow | None:
    with plane.db.read() as s:
        node = s.get(NodeRow, name)
        if node is not None:
            s.expunge(node)
        return node


def test_a_partitioned_agent_fences_before_its_lease_runs_out_and_the_job_runs_once(
        plane: Plane, tmp_path: Path) -> None:
    ref, work, gate = tmp_path / "reference", tmp_path / "work", tmp_path / "gate"
    ref.mkdir()
    work.mkdir()
    opened = tmp_path / "opened"
    opened.touch()
    expected = subprocess.run(["sh", "-c", JOB], cwd=ref, env={**os.environ, "GATE": str(opened)},
                              capture_output=True, check=True, timeout=60).stdout

    token = tmp_path / "agent.token"
    token.write_text(plane.agent)
    token.chmod(0o600)
    node = f"node-f{os.getpid()}"
    log = tmp_path / "agent.log"
    with served(plane.http.app) as url, Relay(("127.0.0.1", urlsplit(url).port or 0), 0.0) as relay, \
            log.open("wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "tidal.agent", "--name", node, "--server", f"http://127.0.0.1:{relay.port}",
             "--token-file", str(token), "--root", str(tmp_path / "root")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "TIDAL_HOME": str(tmp_path / "home")})
        try:
            def registered() -> NodeRow | None:
                assert agent.poll() is None, log.read_text()
                n = _node(plane, node)
                return n if n is not None and n.up else None

            first = wait_until(registered, timeout=60, what=f"{node} to register").agent_id
            jid = plane.submit(command=["sh", "-c", JOB], workdir=str(work), checkpoint_every=1.0, max_restarts=3,
                               env={"PATH": os.environ["PATH"], "GATE": str(gate)})
            wait_until(lambda: _steps(work) >= 20 and plane.job(jid)["checkpoints"], timeout=60,
                       what="the job to reach its gate, checkpointed")
            init = plane.job(jid)["placement"][0]["pid"]
            ranks = descendants(init)
            assert len(ranks) >= 2 and all(pid_alive(p) for p in ranks)  # its init and the command

            os.kill(relay.proc.pid, signal.SIGSTOP)  # the link goes down
            wait_until(lambda: not any(pid_alive(p) for p in ranks), timeout=3 * LEASE,
                       what="the agent to fence its ranks", interval=0.02)
            dead_at = time.time()
            cut = _node(plane, node)
            assert cut is not None and cut.agent_id == first
            assert cut.up and dead_at < cut.lease_until, \
                f"the ranks ran until {dead_at}, the node's lease until {cut.lease_until}"
            fenced = wait_until(lambda: [ln for ln in log.read_text().splitlines() if "fenced its ranks" in ln],
                                timeout=10, what="the agent to log its fence")
            assert f"cannot renew node {node}'s lease for " in fenced[0], fenced
            assert "they will be restored elsewhere from their last checkpoint" in fenced[0], fenced

            # The control plane requeues the job once the lease runs out, not before.
            wait_until(lambda: not registered(), timeout=3 * LEASE, what="the control plane to expire the node")
            with plane.db.read() as s:
                down = list(s.scalars(select(EventRow.time).where(EventRow.kind == "node_down",
                                                                  EventRow.node == node)))
            assert len(down) == 1 and down[0] >= cut.lease_until > dead_at
            requeued = plane.job(jid)
            assert requeued["restarts"] == 0  # a lost lease is not the job's failure: it spends no restart
            # (Preempted when it was lost during a periodic checkpoint, else pending.)
            back = [e["detail"] for e in requeued["events"] if e["kind"] in ("pending", "preempted")][-1]
            assert back.startswith(f"node {node} lost (lease expired); requeued from checkpoint "), back
            assert back.endswith(", not counted as a restart (0/3 used)"), back

            os.kill(relay.proc.pid, signal.SIGCONT)  # the link is back
            second = wait_until(registered, timeout=60, what=f"{node} to register again").agent_id
            assert second != first
            restored = wait_until(lambda: (j := plane.job(jid))["state"] == "running" and j["placement"][0]["pid"]
                                  and j, timeout=60, what="the job to be restored")
            assert restored["placement"][0]["pid"] != init
            assert not any(pid_alive(p) for p in ranks)

            gate.touch()
            done = wait_until(lambda: (j := plane.job(jid))["terminal"] and j, timeout=60, what="the job to end")
            assert done["state"] == "succeeded" and done["restarts"] == 0, done
            wait_until(lambda: plane.http.get(f"/v1/jobs/{jid}/logs", headers=plane.as_user()).content == expected,
                       timeout=30, what="the job's whole output, once")
            assert (work / "progress.txt").read_bytes() == (ref / "progress.txt").read_bytes()
            assert log.read_text().count("fenced its ranks") == 1
        finally:
            agent.terminate()  # the agent leaves: its node is given back
            agent.wait(30)
