#!/usr/bin/env python3
"""Cross-region migration over a capped link: a job moved into another region's store, with and without
pre-copy, against plain CRIU with the image directory copied over the same link.

Test hosts (:class:`tidal.testing.hostcluster.HostCluster` with regions): region west (SeaweedFS on s3w,
node w1) and region east (SeaweedFS on s3e, node e1); the control plane (cp) and PostgreSQL (db) beside
them. Every host of one region reaches every host of the other through a ``tc`` cap of ``--link``
(default 200mbit) each way; within a region, and to cp and db, nothing is capped. ``--delay-ms D`` (default 0:
none, as the README's figures were measured) puts the regions D ms apart each way: each region's store is
reached from the other through a delaying relay on its host (this kernel has no netem), and plain CRIU's
copy goes through one too.

The job holds ``--mb`` MiB of random (incompressible) bytes and prints a step line every 50 ms
(harness.HOLDER). Three moves, one after the other, each from the region the job is in to the other:

1. **plain CRIU** (baseline, same run): a holder on w1, ``criu dump`` into /dev/shm, the image directory
   sent over TCP to e1 (through the cap), ``criu restore`` there.
2. **without pre-copy**: a Tidal job without any checkpoint, ``tidal migrate --to-region``: its checkpoint
   goes into its region's store, then the whole of it crosses to the other region's store, then the restore.
3. **with pre-copy**: a Tidal job whose last checkpoint (a periodic one) is in its region's store only: the
   move first copies that checkpoint to the other region while the job runs on, then checkpoints it and
   copies only the chunks that checkpoint adds.

Reported per move: seconds from the request to the job running on the target and to its first step there;
for Tidal, **stopped → running** (the job's standstill: the longest gap between two of its steps, which carry
the wall-clock time), **ordered → running** (from the move's checkpoint order to the job running again: the
events' times; it includes what the source does while the job still runs), the bytes that crossed the link
(the replication events: stored, compressed bytes) and when, and the source checkpoint's breakdown (its
agent's log). Ratios are against plain CRIU's stopped → running (its dump, copy and restore).

    python benchmarks/crossregion.py [--json FILE] [--mb 1280] [--link 200mbit] [--quick]

Run as root with CRIU provisioned (``make criu``), on a quiet machine: the hosts share its cores. Timings
are never asserted in tests.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path
from typing import Any

from crosshost import last_step, plain_migration, rank_log, tidal_migration
from harness import HOLDER, arguments, host_ranks, machine, run, say, wait_for, write_json
from tidal.testing.hostcluster import HostCluster
from tidal.testing.hosts import TestNet

MB = 1 << 20
REGIONS = {"west": ("s3w", ["w1"]), "east": ("s3e", ["e1"])}
NODE = {"west": "w1", "east": "e1"}
OTHER = {"west": "east", "east": "west"}
CROSSED = re.compile(r"(\d+) chunk\(s\), ([\d.]+) (B|KiB|MiB|GiB) crossed")
STEP_AT = re.compile(rb"^step \d+ \d+ t ([\d.]+)$", re.M)
TIMING = re.compile(r"checkpoint (?P<id>\S+): ranks held (?P<held_s>[\d.]+) s \(dump (?P<dump_s>[\d.]+) s, files "
                    r"(?P<files_s>[\d.]+) s\), commit (?P<commit_s>[\d.]+) s, in all (?P<total_s>[\d.]+) s")
UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def cap(net: TestNet, rate: str) -> None:
    for a in ("s3w", "w1"):
        for b in ("s3e", "e1"):
            net.cap(net[a], net[b], rate)


def move(cluster: HostCluster, job: str, to_region: str) -> dict[str, Any]:
    """``migrate --to-region``: request → running there, → first step there; stopped → running (events)."""
    out = tidal_migration(cluster, job, NODE[OTHER[to_region]], NODE[to_region], {"region": to_region})
    evs, t0 = out["events"], out["requested_at"]
    stop = next(e["time"] for e in evs if e["kind"] == "checkpointing")
    back = next(e["time"] for e in evs if e["kind"] == "running" and e["time"] >= stop)
    crossed = []
    for e in evs:
        m = CROSSED.search(e["detail"] or "") if e["kind"] == "replicated" else None
        if m:
            crossed.append({"ahead": "ahead of the move" in e["detail"], "chunks": int(m.group(1)),
                            "bytes": float(m.group(2)) * UNIT[m.group(3)], "at_s": e["time"] - t0})
    ck = (out["checkpoint"] or {}).get("id")
    times = step_times(rank_log(cluster, NODE[to_region], job))
    # Since the request only (a pre-copied job was preempted once before).
    gap = max((b - a for a, b in itertools.pairwise(times) if b >= t0), default=0.0)
    return {**out, "ordered_to_running_s": back - stop, "ordered_at_s": stop - t0, "crossed": crossed,
            "standstill_s": gap, "source_checkpoint": checkpoint_timing(cluster, NODE[OTHER[to_region]], ck)}


def step_times(log: Path) -> list[float]:
    """The wall-clock time of each step line of the holder's log (restored with it, so its whole history)."""
    return [float(t) for t in STEP_AT.findall(log.read_bytes())] if log.exists() else []


def checkpoint_timing(cluster: HostCluster, node: str, checkpoint_id: str | None) -> dict[str, float] | None:
    """Where the source's checkpoint for the move spent its time, as its agent logs it."""
    if checkpoint_id is None:
        return None
    for m in TIMING.finditer(cluster.agents[node].log.read_text(errors="replace")):
        if m.group("id") == checkpoint_id:
            return {k: float(v) for k, v in m.groupdict().items() if k != "id"}
    return None


def placed_region(cluster: HostCluster, job: str) -> str:
    ((node, _),) = cluster.running_on(job, timeout=300).values()
    return cluster.region_of[node]


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench-crossregion")
    p.add_argument("--mb", type=int, default=1280, help="the job's memory, MiB (default 1280)")
    p.add_argument("--link", default="200mbit", help="the cap between the regions, a tc rate (default 200mbit)")
    p.add_argument("--delay-ms", type=float, default=0.0,
                   help="latency between the regions, each way, through a delaying relay (default 0)")
    p.add_argument("--quick", action="store_true", help="--mb 100")
    args = p.parse_args()
    if args.quick:
        args.mb = 100
    host_ranks()
    out: dict[str, Any] = {"machine": {**machine(), "load_average_at_start": os.getloadavg()}, "mb": args.mb,
                           "link": args.link, "delay_ms": args.delay_ms}
    with TestNet(names=["cp", "db", "s3w", "s3e", "w1", "e1"]) as net:
        say("starting PostgreSQL (db), a SeaweedFS per region (s3w, s3e), tidal server (cp), agents (w1, e1)")
        delay = args.delay_ms / 1000
        cluster = HostCluster(net, regions=REGIONS, seaweedfs={"volume_size_mb": 1024, "volumes": 32},
                              region_delay=delay)
        cap(net, args.link)
        say(f"plain CRIU: a {args.mb} MiB holder on w1 → dump, copy over TCP through the {args.link} cap, "
            "restore on e1")
        out["plain"] = plain_migration(net, args.mb, "w1", "e1", delay)
        work = net.shared / "work"
        work.mkdir(exist_ok=True)
        holder = [sys.executable, "-c", HOLDER.format(mb=args.mb)]

        say("tidal, without pre-copy: a job with no checkpoint moved to the other region")
        job = cluster.submit(holder, cwd=work)
        here = placed_region(cluster, job)
        wait_for(lambda: last_step(rank_log(cluster, NODE[here], job)) >= 20, 300, "the job's step 20")
        out["without_precopy"] = move(cluster, job, OTHER[here])
        cluster.cli("cancel", job)
        cluster.wait_state(job, "cancelled", timeout=120)

        say("tidal, with pre-copy: a job whose last checkpoint is in its region's store only")
        job = cluster.submit(holder, cwd=work, options=["--checkpoint-every", "10m"])
        here = placed_region(cluster, job)
        wait_for(lambda: last_step(rank_log(cluster, NODE[here], job)) >= 20, 300, "the job's step 20")
        # Its last checkpoint, in its own region: a preemption and a resume where it was (the other node is
        # kept busy meanwhile).
        blocker = cluster.submit(["sleep", "3600"], cwd=work, options=["--region", OTHER[here]])
        cluster.running_on(blocker)
        cluster.cli("preempt", job)
        cluster.cli("resume", job)
        placed_region(cluster, job)
        cluster.cli("cancel", blocker)
        cluster.wait_state(blocker, "cancelled", timeout=120)
        wait_for(lambda: last_step(rank_log(cluster, NODE[here], job)) >= 20, 300, "the resumed job's step 20")
        out["with_precopy"] = move(cluster, job, OTHER[here])
        cluster.cli("cancel", job)
    m = out["machine"]
    m["load_average_at_end"] = os.getloadavg()
    pl = out["plain"]
    pl["stopped_to_running_s"] = pl["to_running_s"]
    base = pl["stopped_to_running_s"]
    for key in ("without_precopy", "with_precopy"):
        r = out[key]
        r["stopped_vs_plain"] = r["standstill_s"] / base
        r["crossed_bytes"] = sum(c["bytes"] for c in r["crossed"])
        r["crossed_while_stopped_bytes"] = sum(c["bytes"] for c in r["crossed"] if not c["ahead"])
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / (1 << 30):.0f} GiB, kernel {m['kernel']}, "
          f"CRIU {m['criu']}; test hosts on one bridge, {args.link} between the regions, all on these cores; "
          f"load average {m['load_average_at_start'][0]:.1f} at the start, {m['load_average_at_end'][0]:.1f} at "
          "the end")
    print(f"\nmove of a {args.mb} MiB job west ⇄ east (image {pl['image_bytes'] / MB:.0f} MiB)")
    print(f"{'':34}{'request → running s':>21}{'ordered → running s':>21}{'stopped → running s':>21}"
          f"{'vs plain':>10}{'crossed MiB':>13}{'while stopped':>15}")
    print(f"{'plain CRIU: dump, copy, restore':34}{pl['to_running_s']:>21.2f}{base:>21.2f}{base:>21.2f}{1.0:>10.2f}"
          f"{pl['sent_bytes'] / MB:>13.0f}{pl['sent_bytes'] / MB:>15.0f}")
    for label, key in (("tidal, without pre-copy", "without_precopy"), ("tidal, with pre-copy", "with_precopy")):
        r = out[key]
        print(f"{label:34}{r['to_running_s']:>21.2f}{r['ordered_to_running_s']:>21.2f}{r['standstill_s']:>21.2f}"
              f"{r['stopped_vs_plain']:>10.2f}{r['crossed_bytes'] / MB:>13.0f}"
              f"{r['crossed_while_stopped_bytes'] / MB:>15.1f}")
    print("stopped → running: the job's standstill, the longest gap between two of its steps (50 ms apart while it "
          "runs); ordered → running: from the move's checkpoint order (events), which includes what the source does "
          "while the job still runs")
    print(f"\nplain CRIU's own steps: dump {pl['dump_s']:.2f} s, copy {pl['copy_s']:.2f} s, restore "
          f"{pl['restore_s']:.2f} s")
    for label, key in (("without pre-copy", "without_precopy"), ("with pre-copy", "with_precopy")):
        t = out[key]["source_checkpoint"]
        if t is not None:
            print(f"tidal {label}, the source's checkpoint: ranks held {t['held_s']:.2f} s (dump {t['dump_s']:.2f} s, "
                  f"files {t['files_s']:.2f} s), commit {t['commit_s']:.2f} s, in all {t['total_s']:.2f} s")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
