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

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidal.control import tokens
from tidal.control.reconcile import Reconciler
from tidal.control.store.models import JobRow
from tidal.core import Cluster, Node, Region, Tier, Topology
from tidal.policy.base import Policy
from tidal.policy.registry import LIVE_SINGULARITY, make_live_policy
from tidal.policy.singularity import Singularity
from tidal.policy.sla_admission import SlaAdmission, SlaMode
from tidal.sim.cost import CostModel
from tidal.sim.engine import Simulator
from tidal.sim.trace import TraceJob
from tidal.testing.clock import FakeClock
from tidal.testing.control import FakeAgent, Plane, checkpoint_result

# Two nodes of different sizes, so that best fit has one answer at every step: node → (region, cluster,
# devices). In one cluster, and in two clusters of two regions (the global level then chooses the cluster).
NODES = {"node-1": ("r0", "c0", 2), "node-2": ("r0", "c0", 1)}
TWO_REGIONS = {"node-1": ("west", "west-a", 2), "node-2": ("east", "east-a", 1), "node-3": ("east", "east-a", 3)}
Layout = dict[str, tuple[str, str, int]]
# id, submit (s), duration (s), devices, tier
TRACE = [
    ("a", 0.0, 900.0, 2, Tier.BASIC),
    ("b", 10.0, 1500.0, 1, Tier.BASIC),
    ("c", 20.0, 300.0, 2, Tier.PREMIUM),  # no room: preempts a (basic) on node-1
    ("d", 30.0, 600.0, 1, Tier.STANDARD),  # no room: preempts b (basic) on node-2
    ("e", 40.0, 200.0, 1, Tier.BASIC),  # waits behind a and b (basic, earlier)
]

Decision = tuple[str, str, tuple[tuple[str, int], ...]]  # kind, job, devices

# Spilling: b1 and b2 (basic) fill r1's only node; premium p needs both of its devices (r2's node has one).
# Rather than preempt both, p's room is made by moving b2 (the newer) to r2's idle device and preempting b1.
SPILL = {"node-1": ("r1", "c1", 2), "node-2": ("r2", "c2", 1)}
SPILL_TRACE = [
    ("b1", 0.0, 900.0, 1, Tier.BASIC),
    ("b2", 10.0, 1500.0, 1, Tier.BASIC),  # c1 and c2 have a device free each: the first cluster by name
    ("p", 20.0, 300.0, 2, Tier.PREMIUM),
]


# Backfill: standard s1 and s2 hold a device of each node; the standard gang g cannot preempt them and
# reserves node-1; basic b borrows node-1's idle device (live jobs give no run times, so the gang's horizon
# is unknown: it is not due) and is checkpointed when s2 ends and g takes node-1.
BACKFILL_TRACE = [
    ("s1", 0.0, 600.0, 1, Tier.STANDARD),
    ("s2", 10.0, 900.0, 1, Tier.STANDARD),
    ("g", 20.0, 300.0, 2, Tier.STANDARD),
    ("b", 30.0, 2000.0, 1, Tier.BASIC),
]


def backfill_policy() -> Policy:
    return Singularity(dataclasses.replace(LIVE_SINGULARITY, backfill=True))


Batch = tuple[float, list[tuple[str, str, str]], list[Decision]]  # time, events (kind, job, detail), decisions


def simulate(trace: list[tuple[str, float, float, int, Tier]] = TRACE,
             policy: Callable[[], Policy] = make_live_policy,
             layout: Layout = NODES, hints: bool = False, sla: SlaMode = "off",
             owners: dict[str, str] | None = None) -> list[Batch]:
    """The simulator's decisions, with the time and the events that led to each batch of them. ``hints``: the
    jobs' run times are known (live: each job gives its run time, ``tidal submit --runtime``); without, as
    a live job that gives none. ``sla``: admission against the load (live: TIDAL_ADMIT_SLA). ``owners``: the
    user who submits each job (by default alice)."""
    tree: dict[str, dict[str, list[Node]]] = {}
    for n, (region, cluster, d) in layout.items():
        tree.setdefault(region, {}).setdefault(cluster, []).append(Node(n, d))
    topo = Topology(tuple(Region(r, tuple(Cluster(c, tuple(ns)) for c, ns in cs.items())) for r, cs in tree.items()))
    jobs = [TraceJob(j, t, dur, w, tier, user=(owners or {}).get(j, "alice")) for j, t, dur, w, tier in trace]
    log: list[dict[str, Any]] = []
    admission = SlaAdmission(sla, topo.devices) if sla != "off" else None
    Simulator(topo, jobs, policy(), cost=CostModel(fixed_s=1.0), log=log.append, oracle=hints,
              sla_admission=admission).run()
    batches: dict[float, Batch] = {}  # one decision per instant
    for rec in log:
        _, events, actions = batches.setdefault(rec["time"], (rec["time"], [], []))
        if rec["type"] == "event":
            events.append((rec["kind"], rec["job"], rec.get("detail") or ""))
        else:
            actions.append((rec["kind"], rec["job"], tuple(sorted((n, i) for n, i in rec["placement"]))))
    return list(batches.values())


def decisions(batches: list[Batch]) -> list[Decision]:
    return [d for _, _, ds in batches for d in ds]


def settle(p: Plane, agents: dict[str, FakeAgent], names: dict[str, str]) -> list[Decision]:
    """Run the loop until it asks for nothing more; the agents carry out every action at once. A launch or
    restore over several nodes is one decision (its orders, one a node, come in one pass); a checkpoint
    that stops a job to restore it elsewhere or on another number of devices is a decision to move it
    (migrate, resize) onto the devices it is to be restored on, as the simulator has it: taken when the
    checkpoint is ordered (the restore that follows is part of it)."""
    out: list[Decision] = []
    moving: set[str] = set()  # jobs stopped by a checkpoint to be restored elsewhere (migrate, resize)
    for _ in range(20):
        p.rec.once()
        acts = [(a, act) for a in agents.values() for act in a.actions()]
        if not acts:
            return out
        starts: dict[str, tuple[str, list[tuple[str, int]]]] = {}
        for agent, act in acts:
            job = names[act["job_id"]]
            if act["kind"] in ("launch", "restore"):
                if act["kind"] == "restore" and job in moving:
                    moving.discard(job)
                else:
                    kind = "place" if act["kind"] == "launch" else "resume"
                    starts.setdefault(job, (kind, []))[1].extend((agent.name, r["device"])
                                                                 for r in act["payload"]["ranks"])
                assert agent.result(act, ranks=[{"rank": r["rank"], "pid": 1000 + r["rank"]}
                                                for r in act["payload"]["ranks"]])
            else:
                assert act["kind"] == "checkpoint" and act["payload"]["then"] == "kill"
                with p.db.read() as s:
                    row = s.get(JobRow, act["job_id"])
                    purpose = row.op_purpose if row is not None else None
                    target = sorted({(n, int(i)) for n, i in row.target or ()}) if row is not None else []
                if purpose in ("migrate", "resize"):
                    moving.add(job)
                    out.append((purpose, job, tuple(target)))
                else:
                    out.append(("preempt", job, ()))
                cid = act["payload"]["checkpoint_id"]
                assert agent.result(act, **checkpoint_result(cid, size=1, stored=1))
        out += [(kind, job, tuple(sorted(devs))) for job, (kind, devs) in starts.items()]
    raise AssertionError("the control loop did not settle")


def test_same_events_same_decisions(tmp_path: Path) -> None:
    batches = simulate()
    sim_decisions = decisions(batches)
    # The scenario exercises what the live system executes: placement, checkpoint preemption, resume.
    assert [(k, j) for k, j, _ in sim_decisions] == [
        ("place", "a"), ("place", "b"), ("preempt", "a"), ("place", "c"), ("preempt", "b"), ("place", "d"),
        ("resume", "a"), ("resume", "b"), ("place", "e"),
    ]
    replay(tmp_path, batches, TRACE, make_live_policy())  # the live default


def test_same_decisions_over_two_clusters_in_two_regions(tmp_path: Path) -> None:
    """The global level (which cluster, and so which region) decides live as in the simulator: each gang
    stays in one cluster, preemptions make room within the cluster chosen."""
    batches = simulate(layout=TWO_REGIONS)
    sim_decisions = decisions(batches)
    assert sim_decisions == [
        ("place", "a", (("node-3", 0), ("node-3", 1))),  # one node either way: the cluster with most free (east)
        ("place", "b", (("node-2", 0),)),  # east still has the most free; best fit there
        ("place", "c", (("node-1", 0), ("node-1", 1))),  # premium: west has room, nothing is preempted
        ("place", "d", (("node-3", 2),)),
        ("place", "e", (("node-1", 0),)),  # once c has ended
    ]
    replay(tmp_path, batches, TRACE, make_live_policy(), TWO_REGIONS)


def test_same_decisions_when_a_job_is_moved_to_another_region_to_make_room(tmp_path: Path) -> None:
    """The spill step (policy/spill.py): live, the move is a checkpoint whose restore is on the other region's
    node, decided in the same pass as the simulator decides it."""
    batches = simulate(SPILL_TRACE, layout=SPILL)
    sim_decisions = decisions(batches)
    assert sim_decisions == [
        ("place", "b1", (("node-1", 0),)),
        ("place", "b2", (("node-1", 1),)),
        ("migrate", "b2", (("node-2", 0),)),  # to the idle device of the other region, not preempted
        ("preempt", "b1", ()),  # no idle device left for it
        ("place", "p", (("node-1", 0), ("node-1", 1))),
        ("resume", "b1", (("node-1", 0),)),  # once p has ended
    ]
    live = replay(tmp_path, batches, SPILL_TRACE, make_live_policy(), SPILL)
    moved = [e["detail"] for e in live["b2"]["events"] if e["kind"] == "migrate"]
    assert len(moved) == 1 and moved[0].startswith(f"to node-2 by the scheduler: make room for {live['p']['id']}")


def test_same_decisions_with_backfill(tmp_path: Path) -> None:
    batches = simulate(BACKFILL_TRACE, backfill_policy)
    sim_decisions = decisions(batches)
    assert sim_decisions[:4] == [
        ("place", "s1", (("node-2", 0),)), ("place", "s2", (("node-1", 0),)),
        ("place", "b", (("node-1", 1),)),  # borrowed from g's reservation
        ("preempt", "b", ()),  # s2 ended: g is due and takes its devices back
    ]
    assert sim_decisions[4][:2] == ("place", "g")
    replay(tmp_path, batches, BACKFILL_TRACE, backfill_policy())


# Shrunk starts (policy/shrunk_start.py) weigh the run times jobs give: a and b (standard) hold a device
# each for long; the standard gang s cannot preempt them, and waiting for two devices (until a ends) would
# end later than running both ranks on the one free device now.
SHRUNK_TRACE = [
    ("a", 0.0, 2000.0, 1, Tier.STANDARD),
    ("b", 10.0, 3000.0, 1, Tier.STANDARD),
    ("s", 20.0, 400.0, 2, Tier.STANDARD),
    ("c", 30.0, 100.0, 1, Tier.BASIC),  # waits: nothing free, basic preempts no one
]

# Admission against the load: p and s1 fill the 3 devices for an hour; s2 (10 min of standard work) would
# wait about an hour; s3 comes behind it. With ``defer`` both are held until p ends; with ``demote`` s2
# runs as basic and s3, long enough to meet its target anyway, is admitted as standard.
ADMISSION_TRACE = [
    ("p", 0.0, 3600.0, 2, Tier.PREMIUM),
    ("s1", 10.0, 3600.0, 1, Tier.STANDARD),
    ("s2", 20.0, 600.0, 1, Tier.STANDARD),
    ("s3", 30.0, 100_000.0, 1, Tier.STANDARD),
    ("b", 40.0, 500.0, 1, Tier.BASIC),
]


def test_same_shrunk_starts_by_the_run_times_jobs_give(tmp_path: Path) -> None:
    batches = simulate(SHRUNK_TRACE, hints=True)
    sim_decisions = decisions(batches)
    assert sim_decisions[:3] == [
        ("place", "a", (("node-2", 0),)), ("place", "b", (("node-1", 0),)),
        ("place", "s", (("node-1", 1), ("node-1", 1))),  # both ranks on the one free device
    ]
    replay(tmp_path, batches, SHRUNK_TRACE, make_live_policy(), hints=True)


def test_same_admission_deferred_then_released(tmp_path: Path) -> None:
    batches = simulate(ADMISSION_TRACE, hints=True, sla="defer")
    kinds = {(k, j) for _, evs, _ in batches for k, j, _ in evs}
    assert {("job_deferred", "s2"), ("job_deferred", "s3")} <= kinds
    live = replay(tmp_path, batches, ADMISSION_TRACE, make_live_policy(), hints=True, sla="defer")
    assert {j: r["tier"] for j, r in live.items()} == {
        "p": "premium", "s1": "standard", "s2": "standard", "s3": "standard", "b": "basic"}


def test_same_admission_demoted(tmp_path: Path) -> None:
    batches = simulate(ADMISSION_TRACE, hints=True, sla="demote")
    live = replay(tmp_path, batches, ADMISSION_TRACE, make_live_policy(), hints=True, sla="demote")
    assert {j: r["tier"] for j, r in live.items()} == {
        "p": "premium", "s1": "standard", "s2": "basic", "s3": "standard", "b": "basic"}


# Resuming where its checkpoint is: basic a is preempted in c2 by the premium gang p (only node-2 holds 3
# devices). When p, b and q end at the same instant, c1 has the more free devices (4 against 3), but a
# resumes in c2, the cluster of its checkpoint (policy/global_level.py).
RESUME_LAYOUT = {"node-1": ("r1", "c1", 4), "node-2": ("r2", "c2", 3)}


def resume_trace() -> list[tuple[str, float, float, int, Tier]]:
    """b and q end when p does: p's end (its start waits for a's checkpoint) taken from a first run."""
    probe = [("b", 0.0, 1e4, 2, Tier.BASIC), ("a", 1.0, 1e4, 1, Tier.BASIC), ("q", 2.0, 1e4, 2, Tier.PREMIUM),
             ("p", 10.0, 100.0, 3, Tier.PREMIUM)]
    p_end = next(at for at, evs, _ in simulate(probe, layout=RESUME_LAYOUT) if ("job_finished", "p", "") in evs)
    return [("b", 0.0, p_end, 2, Tier.BASIC), ("a", 1.0, 1000.0, 1, Tier.BASIC),
            ("q", 2.0, p_end - 2.0, 2, Tier.PREMIUM), ("p", 10.0, 100.0, 3, Tier.PREMIUM)]


def test_same_resume_in_the_cluster_holding_its_checkpoint(tmp_path: Path) -> None:
    trace = resume_trace()
    batches = simulate(trace, layout=RESUME_LAYOUT)
    assert decisions(batches) == [
        ("place", "b", (("node-1", 0), ("node-1", 1))), ("place", "a", (("node-2", 0),)),
        ("place", "q", (("node-1", 2), ("node-1", 3))),
        ("preempt", "a", ()), ("place", "p", (("node-2", 0), ("node-2", 1), ("node-2", 2))),
        ("resume", "a", (("node-2", 0),)),  # c2, its checkpoint's, not c1 with more free
    ]
    assert {j for _, evs, _ in batches[-2:-1] for k, j, _ in evs if k == "job_finished"} == {"b", "q", "p"}
    replay(tmp_path, batches, trace, make_live_policy(), RESUME_LAYOUT)


# Fair share between users (policy/queue_order.py): alice floods the basic tier with 20 one-device jobs;
# bob submits one while they wait. In arrival order his would start after all of hers; as she holds devices
# and he none, his goes next when one frees.
FLOOD_TRACE = [(f"a{i}", float(i), 100.0 + 7.0 * i, 1, Tier.BASIC) for i in range(20)] + [
    ("bob", 30.0, 100.0, 1, Tier.BASIC)]
FLOOD_OWNERS = {"bob": "bob"}  # the others are alice's


def test_same_decisions_when_one_user_floods_a_tier(tmp_path: Path) -> None:
    batches = simulate(FLOOD_TRACE, owners=FLOOD_OWNERS)
    starts = [j for k, j, _ in decisions(batches) if k == "place"]
    assert starts[:4] == ["a0", "a1", "a2", "bob"]  # the first to start once a device frees: before 17 of 20
    arrival = Singularity(dataclasses.replace(LIVE_SINGULARITY, user_share=False))
    assert [j for k, j, _ in decisions(simulate(FLOOD_TRACE, lambda: arrival, owners=FLOOD_OWNERS))
            if k == "place"][-1] == "bob"  # without turns between users: after the whole flood
    live = replay(tmp_path, batches, FLOOD_TRACE, make_live_policy(), owners=FLOOD_OWNERS)
    assert {j["owner"] for name, j in live.items() if name != "bob"} == {"alice"} and live["bob"]["owner"] == "bob"


def replay(tmp_path: Path, batches: list[Batch], trace: list[tuple[str, float, float, int, Tier]], policy: Policy,
           layout: Layout = NODES, hints: bool = False, sla: SlaMode = "off",
           owners: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Feed the simulator's events to a live control plane running ``policy``: the same decisions, and, with
    ``sla``, the same admission (each job's tier, deferral and its reason). ``hints``: each job is submitted
    with its run time; ``owners``: by the user given (by default alice). Returns each trace job's live record
    (``tidal show``'s), with its live id under ``"id"``."""
    p = Plane(tmp_path, admit_sla=sla, lease_s=1e9)  # the agents hold their nodes across the trace's hours
    owner_of = {j: (owners or {}).get(j, "alice") for j, *_ in trace}
    headers = {"alice": p.as_user()}
    with p.db.tx() as s:
        for name in sorted(set(owner_of.values()) - {"alice"}):
            headers[name] = {"Authorization": f"Bearer {tokens.create_user(s, name, 'user')}"}

    def show(job: str) -> dict[str, Any]:
        return p.http.get(f"/v1/jobs/{ids[job]}", headers=headers[owner_of[job]]).json()  # type: ignore[no-any-return]

    clock = FakeClock(time=0.0)  # the trace's time (jobs' start times, run times left, the minimum run)
    p.db.info["clock"] = clock
    p.rec = Reconciler(p.db, policy, clock=clock)
    agents = {n: FakeAgent(p, n, f"agent-{n}", devices=d, region=r, cluster=c) for n, (r, c, d) in layout.items()}
    for a in agents.values():
        assert a.register() == 200
    spec = {j: (w, tier, dur) for j, _, dur, w, tier in trace}
    ids: dict[str, str] = {}  # trace job → live job id
    names: dict[str, str] = {}
    live: list[list[Decision]] = []
    for at, events, _ in batches:
        clock.advance(at - clock.time())
        for kind, job, detail in events:
            if kind in ("job_submitted", "job_deferred") and job not in ids:
                w, tier, dur = spec[job]
                r = p.http.post("/v1/jobs", headers=headers[owner_of[job]], json={
                    "command": ["train"], "workdir": str(p.workdir), "name": job, "ranks": w, "tier": tier.value,
                    **({"runtime": dur} if hints else {})})
                assert r.status_code == 201, r.text
                reply = r.json()
                ids[job] = reply["id"]
                names[ids[job]] = job
                # Admitted as the simulator admitted it: deferred with its reason, or at the tier it gave.
                if kind == "job_deferred":
                    assert show(job)["reason"] == detail
                else:
                    demoted = detail.removeprefix("accepted as ").split(":")[0] if detail.startswith("accepted as") \
                        else None
                    assert reply.get("admitted_as") == demoted
            elif kind == "job_finished":
                j = show(job)
                node = j["placement"][0]["node"]
                r = p.http.post(f"/v1/agent/{node}/exits", headers=p.as_agent(), json={
                    "agent_id": agents[node].id, "job_id": ids[job], "attempt": j["attempt"],
                    "ranks": [{"rank": x["rank"], "code": 0, "signal": None} for x in j["placement"]]})
                assert r.json()["applied"]
        live.append(settle(p, agents, names))
        for kind, job, detail in events:  # a deferred job the simulator released: released live too, as told
            if kind == "job_submitted" and detail.startswith("released: "):
                assert [e["detail"] for e in show(job)["events"] if e["kind"] == "released"] == [detail]
    # The same decisions in the same order. A job preempted in one decision may resume in the next: live,
    # that is the loop's next pass; in the simulator, a wake-up a millisecond later (another batch).
    assert [d for ds in live for d in ds] == decisions(batches)
    done = {job: show(job) for job in ids}
    assert all(j["state"] == "succeeded" for j in done.values())
    p.db.close()
    return done
