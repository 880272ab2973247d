"""A job's restart budget counts its own failures only, and a node that keeps losing its lease is drained: the
control plane in-process (SQLite, the live policy, the HTTP API) on a fake clock, with scripted agents whose
leases run out when a test stops renewing them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tidal.control import tokens
from tidal.control.reconcile import Reconciler
from tidal.control.store.models import EventRow, NodeRow
from tidal.policy.registry import make_live_policy
from tidal.testing import FakeClock
from tidal.testing.control import FakeAgent, Plane, checkpoint_result

LEASE = 5.0
DRAINED = "lease lost 3 times in 10 min; until healthy for 10 min"


class Cluster:
    """A plane on a fake clock with agents for ``nodes`` (1 device each); an agent that lost its node's lease
    registers again as a new agent (:meth:`join`), as a real one does."""

    def __init__(self, home: Path, nodes: tuple[str, ...] = ("node-1", "node-2")) -> None:
        self.clock = FakeClock()
        self.p = Plane(home, lease_s=LEASE)
        self.p.db.info["clock"] = self.clock
        self.p.rec = Reconciler(self.p.db, make_live_policy(), clock=self.clock)
        with self.p.db.tx() as s:
            self.admin = tokens.create_user(s, "root", "admin")
        self.agents: dict[str, FakeAgent] = {}
        self._n = 0
        for n in nodes:
            self.join(n)

    def join(self, node: str) -> FakeAgent:
        self._n += 1
        a = FakeAgent(self.p, node, f"{node}-agent-{self._n}")
        assert a.register() == 200
        self.agents[node] = a
        return a

    def advance(self, seconds: float, *, silent: tuple[str, ...] = ()) -> None:
        """Let ``seconds`` pass, a reconcile pass every 4 s (within the 5 s lease); the agents of the nodes not
        ``silent`` renew their leases meanwhile."""
        left = seconds
        while left > 0:
            step = min(4.0, left)
            self.clock.advance(step)
            left -= step
            for name, a in self.agents.items():
                if name not in silent:
                    r = self.p.http.post(f"/v1/agent/{name}/heartbeat", headers=self.p.as_agent(),
                                         json={"agent_id": a.id})
                    assert r.status_code == 200, r.text
            self.p.rec.once()

    def lose(self, node: str) -> None:
        """``node``'s agent stops renewing its lease (the control plane cannot hear it) until it runs out and the
        reconcile loop expires the node."""
        self.advance(LEASE + 1, silent=(node,))
        assert not self.node(node)["up"]
        del self.agents[node]

    def answer(self) -> None:
        """Every agent carries out its actions: starts say their pids, checkpoints commit, kills are done."""
        for a in self.agents.values():
            for act in a.actions():
                if act["kind"] in ("launch", "restore"):
                    assert a.result(act, ranks=[{"rank": r["rank"], "pid": 100 + r["rank"]}
                                                for r in act["payload"]["ranks"]])
                elif act["kind"] == "checkpoint":
                    assert a.result(act, **checkpoint_result(act["payload"]["checkpoint_id"]))
                elif act["kind"] == "kill":
                    assert a.result(act, ranks=[])

    def step(self) -> None:
        self.p.rec.once()
        self.answer()

    def node(self, name: str) -> dict[str, Any]:
        r = self.p.http.get("/v1/nodes", headers=self.p.as_user())
        assert r.status_code == 200, r.text
        return next(n for n in r.json() if n["name"] == name)

    def where(self, jid: str) -> str | None:
        j = self.p.job(jid)
        return j["placement"][0]["node"] if j["state"] == "running" and j["placement"] else None

    def events(self, kind: str, node: str | None = None) -> list[str]:
        with self.p.db.read() as s:
            q = select(EventRow.detail).where(EventRow.kind == kind).order_by(EventRow.seq)
            if node is not None:
                q = q.where(EventRow.node == node)
            return list(s.scalars(q))

    def as_admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    yield cluster
    cluster.p.db.close()


def test_a_job_lost_with_its_node_five_times_spends_none_of_its_restarts(c: Cluster) -> None:
    """Each lost lease requeues the job from its last checkpoint, saying it did not count; with its budget of 3
    it would have failed at the fourth loss if node losses counted."""
    jid = c.p.submit(name="victim")  # max_restarts 3, the default
    c.step()
    # A checkpoint to come back to: held by its owner, then resumed.
    assert c.p.http.post(f"/v1/jobs/{jid}/preempt", headers=c.p.as_user()).status_code == 200
    c.answer()
    (ck,) = [x["id"] for x in c.p.http.get(f"/v1/jobs/{jid}/checkpoints", headers=c.p.as_user()).json()]
    assert c.p.http.post(f"/v1/jobs/{jid}/resume", headers=c.p.as_user()).status_code == 200
    c.step()
    lost = []
    for _ in range(5):
        node = c.where(jid)
        assert node is not None, c.p.job(jid)
        c.lose(node)
        lost.append(node)
        j = c.p.job(jid)
        assert j["restarts"] == 0 and j["state"] != "failed", j
        requeued = [e["detail"] for e in j["events"] if e["kind"] == "pending"]
        assert requeued[-1] == (f"node {node} lost (lease expired); requeued from checkpoint {ck}, not counted as a "
                                "restart (0/3 used)")
        c.answer()  # the other node restores it at once
        c.join(node)
    j = c.p.job(jid)
    assert j["state"] == "running" and j["restarts"] == 0 and j["error"] is None
    assert lost == ["node-1", "node-2", "node-1", "node-2", "node-1"] or lost == ["node-2", "node-1", "node-2",
                                                                                 "node-1", "node-2"]
    # The node lost three times in those seconds is drained; the other, lost twice, is not.
    assert c.node(lost[0])["drain_reason"] == DRAINED and c.node(lost[1])["drained"] is None


def test_a_job_whose_agent_stops_is_requeued_without_a_restart(c: Cluster) -> None:
    jid = c.p.submit()
    c.step()
    node = c.where(jid)
    assert node is not None
    r = c.p.http.post(f"/v1/agent/{node}/leave", headers=c.p.as_agent(), json={"agent_id": c.agents[node].id})
    assert r.status_code == 200, r.text
    j = c.p.job(jid)
    assert j["restarts"] == 0
    assert [e["detail"] for e in j["events"] if e["kind"] == "pending"][-1] == (
        f"node {node} lost (its agent stopped); requeued from scratch, not counted as a restart (0/3 used)")
    with c.p.db.read() as s:
        row = s.get(NodeRow, node)
        assert row is not None and not row.lease_losses  # an agent that stops has lost no lease


def test_own_failures_still_spend_the_budget(c: Cluster) -> None:
    """A rank killed from outside Tidal is the job's own failure: restored up to max_restarts, then failed."""
    jid = c.p.submit(max_restarts=1)
    c.step()
    node = c.where(jid)
    assert node is not None
    assert c.agents[node].exit(jid, attempt=1, code=None, signal=9)
    assert c.p.job(jid)["restarts"] == 1
    c.step()
    node = c.where(jid)
    assert node is not None
    assert c.agents[node].exit(jid, attempt=2, code=None, signal=11)
    j = c.p.job(jid)
    assert j["state"] == "failed" and j["restarts"] == 1
    assert j["events"][-1]["detail"] == ("rank 0 killed by signal 11 from outside Tidal; no restarts left (1)")


def test_a_flapping_node_is_drained_and_a_requeued_job_is_not_restored_onto_it(c: Cluster) -> None:
    blocker = c.p.submit(name="blocker")
    c.step()
    busy = c.where(blocker)
    jid = c.p.submit(name="victim")
    c.step()
    flapping = c.where(jid)
    assert busy is not None and flapping is not None and busy != flapping
    for _ in range(3):
        assert c.where(jid) == flapping
        assert c.node(flapping)["drained"] is None
        c.lose(flapping)
        c.join(flapping)
        c.step()  # the only free node: the job is restored there, until the node is drained
    node = c.node(flapping)
    assert node["up"] and node["free"] == 1
    assert (node["drained"], node["drain_reason"]) == ("lease", DRAINED)
    assert node["undrain_at"] == pytest.approx(c.clock.time() + 600, abs=1)
    assert c.events("node_drained", flapping) == [DRAINED]
    # Up and idle, it takes nothing: the job waits, and so does a new one; the next pass that explains why
    # (the new job's) says so of both.
    c.step()
    late = c.p.submit(name="late")
    c.step()
    for waiting in (jid, late):
        j = c.p.job(waiting)
        assert j["state"] == "pending" and j["restarts"] == 0
        assert j["reason"] == "needs 1 free device(s), 0 free (1 more idle on drained nodes, which take no new jobs)"
    assert c.agents[flapping].actions() == []
    # The job already on the other node went on all along; once it ends, the waiting job goes there.
    assert c.p.job(blocker)["state"] == "running"
    assert c.agents[busy].exit(blocker, attempt=1, code=0)
    c.step()
    assert c.where(jid) == busy and c.p.job(late)["state"] == "pending"


def test_only_losses_within_the_window_count(c: Cluster) -> None:
    """Three losses drain a node only within 10 minutes of each other (a sliding window)."""
    start = c.clock.time()

    def lose_at(t: float) -> None:  # the node is lost t seconds after the start (6 s after it falls silent)
        c.advance(t - (LEASE + 1) - (c.clock.time() - start))
        c.lose("node-1")
        assert c.clock.time() - start == t
        c.join("node-1")

    for t in (6.0, 366.0, 666.0):
        lose_at(t)
    assert c.node("node-1")["drained"] is None  # at 0:06, 6:06 and 11:06: two within any 10 minutes
    assert c.events("node_drained") == []
    lose_at(726.0)  # with those at 6:06 and 11:06, three within 10 minutes
    assert c.node("node-1")["drain_reason"] == DRAINED
    with c.p.db.read() as s:
        row = s.get(NodeRow, "node-1")
        assert row is not None and row.lease_losses == [start + 366.0, start + 666.0, start + 726.0]  # the last 3


def test_a_drained_node_is_undrained_once_healthy_for_ten_minutes(c: Cluster) -> None:
    for _ in range(3):
        c.lose("node-1")
        c.join("node-1")
    assert c.node("node-1")["drained"] == "lease"
    jid = c.p.submit()
    busy = c.p.submit()
    c.step()
    c.step()
    assert {c.where(jid), c.where(busy)} == {"node-2", None}
    waiting = jid if c.where(jid) is None else busy
    # Healthy for 5 minutes, then its lease is lost once more: its healthy time starts again.
    c.advance(300)
    c.lose("node-1")
    c.join("node-1")
    assert c.node("node-1")["drained"] == "lease"
    assert len(c.events("node_drained", "node-1")) == 1  # drained once, not again
    c.advance(596)
    assert c.node("node-1")["drained"] == "lease" and c.where(waiting) is None
    c.advance(4)
    assert c.node("node-1")["drained"] is None
    assert c.events("node_undrained", "node-1") == ["healthy for 10 min (up, its lease renewed): it takes jobs "
                                                    "again"]
    c.step()
    assert c.where(waiting) == "node-1"
    with c.p.db.read() as s:
        row = s.get(NodeRow, "node-1")
        assert row is not None and row.lease_losses == []  # a fresh start


def test_a_drain_that_would_leave_most_nodes_drained_is_withheld(tmp_path: Path) -> None:
    """Every node losing its lease points at the control plane, not the nodes: the only node of a cluster is
    never drained for it (nor, of two nodes, the second)."""
    c = Cluster(tmp_path, nodes=("node-1",))
    try:
        for _ in range(3):
            c.lose("node-1")
            c.join("node-1")
        assert c.node("node-1")["drained"] is None
        assert c.events("drain_withheld", "node-1") == [
            "lease lost 3 times in 10 min, but draining it would leave 1 of 1 node(s) drained, more than half: leases "
            "lost on so many nodes point at the control plane or the network rather than at the nodes; not drained"]
        jid = c.p.submit()
        c.step()
        assert c.where(jid) == "node-1"
    finally:
        c.p.db.close()


def test_an_admin_drains_and_undrains_a_node_and_a_user_may_not(c: Cluster) -> None:
    running = c.p.submit(name="running")
    c.step()
    node = c.where(running)
    assert node is not None
    other = "node-2" if node == "node-1" else "node-1"
    user = c.p.as_user()
    r = c.p.http.post(f"/v1/nodes/{node}/drain", headers=user, json={"reason": "disk swap"})
    assert (r.status_code, r.json()["error"]) == (403, "Forbidden")
    assert c.p.http.post(f"/v1/nodes/{node}/undrain", headers=user).status_code == 403
    assert c.p.http.post("/v1/nodes/node-9/drain", headers=c.as_admin(), json={}).status_code == 404
    r = c.p.http.post(f"/v1/nodes/{node}/drain", headers=c.as_admin(), json={"reason": "disk swap"})
    assert r.status_code == 200, r.text
    reason = f"drained by root: disk swap; until `tidal node undrain {node}`"
    assert r.json() == {"name": node, "drained": "admin", "drain_reason": reason, "drained_at": c.clock.time(),
                        "undrain_at": None}
    assert c.node(node)["drain_reason"] == reason
    # The job there runs on (no kill, no move); new jobs go elsewhere, then wait.
    first = c.p.submit(name="first")
    c.step()
    second = c.p.submit(name="second")
    c.step()
    assert c.where(running) == node and c.where(first) == other and c.p.job(second)["state"] == "pending"
    assert c.agents[node].actions() == []
    r = c.p.http.post(f"/v1/jobs/{running}/migrate", headers=user, json={"to": node})
    assert r.status_code == 409  # it is there already; a move onto a drained node is refused:
    r = c.p.http.post(f"/v1/jobs/{first}/migrate", headers=user, json={"to": node})
    assert (r.status_code, r.json()["message"]) == (409, f"node {node} is drained ({reason}): nothing new is placed "
                                                         "there")
    # An admin's drain is not lifted by time.
    c.advance(700)
    assert c.node(node)["drained"] == "admin"
    r = c.p.http.post(f"/v1/nodes/{node}/undrain", headers=c.as_admin())
    assert r.status_code == 200 and r.json()["drained"] is None
    assert c.events("node_drained", node) == [reason]
    assert c.events("node_undrained", node) == [f"undrained by root (it was {reason})"]
    assert c.p.http.post(f"/v1/jobs/{running}/cancel", headers=user).status_code == 200
    c.answer()
    c.step()
    assert c.where(second) == node
