"""The simulator and the live control loop, given the same events, make the same scheduling decisions.

The simulator runs the live control plane's default policy (``tidal.policy.registry.make_live_policy``) on a
small trace; its event log is then replayed into a real control plane (API, SQLite database, reconcile
loop): each submission is posted to the API and each completion is reported by the node's agent (scripted:
it acknowledges what it is told to run, with no processes behind it). After each batch of events the loop
runs until it asks for nothing more, and the actions the agents received — launch, restore, checkpoint
for a preemption — must be the simulator's place, resume and preempt actions, job for job and device for
device, in the same order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidal.control.reconcile import Reconciler
from tidal.core import Cluster, Node, Region, Tier, Topology
from tidal.policy.registry import make_live_policy
from tidal.sim.cost import CostModel
from tidal.sim.engine import Simulator
from tidal.sim.trace import TraceJob
from tidal.testing.control import FakeAgent, Plane, checkpoint_result

# Two nodes of different sizes, so that best fit has one answer at every step.
NODES = {"node-1": 2, "node-2": 1}
# id, submit (s), duration (s), devices, tier
TRACE = [
    ("a", 0.0, 900.0, 2, Tier.BASIC),
    ("b", 10.0, 1500.0, 1, Tier.BASIC),
    ("c", 20.0, 300.0, 2, Tier.PREMIUM),  # no room: preempts a (basic) on node-1
    ("d", 30.0, 600.0, 1, Tier.STANDARD),  # no room: preempts b (basic) on node-2
    ("e", 40.0, 200.0, 1, Tier.BASIC),  # waits behind a and b (basic, earlier)
]

Decision = tuple[str, str, tuple[tuple[str, int], ...]]  # kind, job, devices


def simulate() -> list[tuple[list[tuple[str, str]], list[Decision]]]:
    """The simulator's decisions, with the events that led to each batch of them."""
    topo = Topology((Region("r0", (Cluster("c0", tuple(Node(n, d) for n, d in NODES.items())),)),))
    jobs = [TraceJob(j, t, dur, w, tier) for j, t, dur, w, tier in TRACE]
    log: list[dict[str, Any]] = []
    Simulator(topo, jobs, make_live_policy(), cost=CostModel(fixed_s=1.0), log=log.append).run()
    batches: dict[float, tuple[list[tuple[str, str]], list[Decision]]] = {}  # one decision per instant
    for rec in log:
        events, actions = batches.setdefault(rec["time"], ([], []))
        if rec["type"] == "event":
            events.append((rec["kind"], rec["job"]))
        else:
            actions.append((rec["kind"], rec["job"], tuple(sorted((n, i) for n, i in rec["placement"]))))
    return list(batches.values())


def settle(p: Plane, agents: dict[str, FakeAgent], names: dict[str, str]) -> list[Decision]:
    """Run the loop until it asks for nothing more; the agents carry out every action at once."""
    out: list[Decision] = []
    for _ in range(20):
        p.rec.once()
        acts = [(a, act) for a in agents.values() for act in a.actions()]
        if not acts:
            return out
        for agent, act in acts:
            job = names[act["job_id"]]
            if act["kind"] in ("launch", "restore"):
                devs = tuple(sorted((agent.name, r["device"]) for r in act["payload"]["ranks"]))
                out.append(("place" if act["kind"] == "launch" else "resume", job, devs))
                assert agent.result(act, ranks=[{"rank": r["rank"], "pid": 1000 + r["rank"]}
                                                for r in act["payload"]["ranks"]])
            else:
                assert act["kind"] == "checkpoint" and act["payload"]["then"] == "kill"
                out.append(("preempt", job, ()))
                cid = act["payload"]["checkpoint_id"]
                assert agent.result(act, **checkpoint_result(cid, size=1, stored=1))
    raise AssertionError("the control loop did not settle")


def test_same_events_same_decisions(tmp_path: Path) -> None:
    batches = simulate()
    sim_decisions = [d for _, ds in batches for d in ds]
    # The scenario exercises what the live system executes: placement, checkpoint preemption, resume.
    assert [(k, j) for k, j, _ in sim_decisions] == [
        ("place", "a"), ("place", "b"), ("preempt", "a"), ("place", "c"), ("preempt", "b"), ("place", "d"),
        ("resume", "a"), ("resume", "b"), ("place", "e"),
    ]

    p = Plane(tmp_path)
    p.rec = Reconciler(p.db, make_live_policy())  # the live default
    agents = {n: FakeAgent(p, n, f"agent-{n}", devices=d) for n, d in NODES.items()}
    for a in agents.values():
        assert a.register() == 200
    spec = {j: (w, tier) for j, _, _, w, tier in TRACE}
    ids: dict[str, str] = {}  # trace job → live job id
    names: dict[str, str] = {}
    live: list[list[Decision]] = []
    for events, _ in batches:
        for kind, job in events:
            if kind == "job_submitted":
                w, tier = spec[job]
                ids[job] = p.submit(name=job, ranks=w, tier=tier.value)
                names[ids[job]] = job
            elif kind == "job_finished":
                j = p.job(ids[job])
                node = j["placement"][0]["node"]
                r = p.http.post(f"/v1/agent/{node}/exits", headers=p.as_agent(), json={
                    "agent_id": agents[node].id, "job_id": ids[job], "attempt": j["attempt"],
                    "ranks": [{"rank": x["rank"], "code": 0, "signal": None} for x in j["placement"]]})
                assert r.json()["applied"]
        live.append(settle(p, agents, names))
    assert live == [ds for _, ds in batches]
    assert all(p.job(i)["state"] == "succeeded" for i in ids.values())
    p.db.close()
