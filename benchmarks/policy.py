"""How long one decision takes at scale: 10,000 nodes × 8 devices, 50,000 jobs.

20,000 jobs run and 30,000 wait, of mixed tiers and sizes 1–64 devices, with some devices free. Times
one full ``decide()`` (a fresh policy building its indexes from the view, then deciding) and one
decision after a single new arrival (the incremental path), and checks that the full decision is
work-conserving: no waiting job is left that could start on the devices still free.

    PYTHONPATH=src python benchmarks/policy.py [--json out.json] [--policy singularity]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

from harness import run, write_json
from tidal.core import ClusterView, DeviceRef, Event, EventKind, JobState, JobView, Tier, Topology, rank_map
from tidal.policy import make_policy
from tidal.policy.global_level import place

SIZES = [1] * 130 + [2] * 24 + [4] * 20 + [8] * 16 + [16] * 6 + [32] * 3 + [64] * 1  # mean ≈ 3.2 devices
TIERS = [Tier.PREMIUM] * 2 + [Tier.STANDARD] * 3 + [Tier.BASIC] * 5


def build(seed: int = 0, nodes: int = 10_000, per: int = 8, running: int = 20_000, pending: int = 30_000,
          spare: int = 6_000) -> tuple[ClusterView, float]:
    rng = random.Random(seed)
    topo = Topology.uniform(nodes, per)
    now = 1_000_000.0
    jobs: dict[str, JobView] = {}
    free = [per] * nodes
    partial: list[int] = []  # nodes with some free devices, for small jobs
    next_whole = 0
    used = 0
    budget = nodes * per - spare
    k = 0
    while k < running:
        w = rng.choice(SIZES)
        if used + w > budget:
            w = 1
            if used + w > budget:
                break
        devs: list[DeviceRef] = []
        if next_whole + max(1, w // per) > nodes - spare // per:
            break  # keep about ``spare`` devices on whole free nodes
        if w <= per:
            while partial and free[partial[-1]] < w:
                partial.pop()
            if partial:
                n = partial[-1]
            else:
                n, next_whole = next_whole, next_whole + 1
                partial.append(n)
            start = per - free[n]
            devs = [DeviceRef(f"c0-n{n}", start + i) for i in range(w)]
            free[n] -= w
        else:
            for _ in range(w // per):
                n, next_whole = next_whole, next_whole + 1
                devs += [DeviceRef(f"c0-n{n}", i) for i in range(per)]
                free[n] = 0
        used += w
        tier = rng.choice(TIERS)
        jobs[f"r{k}"] = JobView(f"r{k}", w, tier, rng.uniform(0, now), JobState.RUNNING,
                                project=f"p{rng.randrange(20)}", placement=rank_map(tuple(devs), w),
                                started_at=now - rng.uniform(0, 7200), attained_device_s=rng.uniform(0, 10_000))
        k += 1
    for i in range(pending):
        w = rng.choice(SIZES)
        jobs[f"q{i}"] = JobView(f"q{i}", w, rng.choice(TIERS), now - rng.uniform(0, 86_400),
                                project=f"p{rng.randrange(20)}")
    return ClusterView(topo, jobs), now


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--policy", default="singularity")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    view, now = build(args.seed)
    free0 = view.topology.devices - sum(len(j.devices) for j in view.jobs.values())
    pol = make_policy(args.policy)
    t, c = time.perf_counter(), time.process_time()
    actions = pol.decide(view, [], now)
    full, full_cpu = time.perf_counter() - t, time.process_time() - c
    st = pol.st
    assert st is not None
    # Work conservation: every job still waiting cannot start even at its smallest start size.
    frac = getattr(getattr(pol, "cfg", None), "elastic_start_fraction", 1.0)
    reservations = getattr(pol, "reservations", None)
    if reservations is not None:
        reservations.hide(st)  # devices held back for a waiting guaranteed gang are not idle by mistake
    reserved = sum(len(n) for _, n in reservations.by_job.values()) if reservations is not None else 0
    leftover = [r.id for r in st.pending.values() if place(st, r, max(r.lo, math.ceil(r.W * frac))) is not None]
    results = {}
    for label, tier, w in (("basic-4", Tier.BASIC, 4), ("premium-8", Tier.PREMIUM, 8)):
        jobs = dict(view.jobs)
        jid = f"new-{label}"
        jobs[jid] = JobView(jid, w, tier, now + 1, project="p0")
        v2 = ClusterView(view.topology, jobs)
        ev = Event("e-new", now + 1, EventKind.JOB_SUBMITTED, job_id=jid)
        p2 = make_policy(args.policy)
        p2.decide(view, [], now)  # warm: indexes built, the same state as after the full decision
        t, c = time.perf_counter(), time.process_time()
        acts = p2.decide(v2, [ev], now + 1)
        results[label] = {"incremental_decide_s": time.perf_counter() - t,
                          "incremental_decide_cpu_s": time.process_time() - c, "actions": len(acts),
                          "kinds": sorted({a.kind.value for a in acts})}
    out = {
        "policy": args.policy,
        "nodes": 10_000, "devices": view.topology.devices, "jobs": len(view.jobs),
        "running": sum(1 for j in view.jobs.values() if j.placement),
        "pending": sum(1 for j in view.jobs.values() if not j.placement),
        "free_devices_before": free0,
        "full_decide_s": full,
        "full_decide_cpu_s": full_cpu,  # less disturbed than the wall clock by other load on the machine
        "full_actions": len(actions),
        "full_action_kinds": {k: sum(1 for a in actions if a.kind.value == k) for k in {a.kind.value for a in actions}},
        "free_devices_after": st.free_total,
        "reserved_nodes": reserved,
        "work_conserving": not leftover,
        "placeable_left_waiting": len(leftover),
        "incremental_decide_s": results["basic-4"]["incremental_decide_s"],
        "incremental_decide_cpu_s": results["basic-4"]["incremental_decide_cpu_s"],
        "incremental": results,
    }
    print(json.dumps(out, indent=2))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
