#!/usr/bin/env python3
"""Interposer benchmark: what Tidal's torch.distributed interposer costs a DDP job, and jobs with sub-groups and
point-to-point (FSDP2, HSDP, tensor parallel, a pipeline), in one run.

* **Steady-state overhead.** The same job under plain ``torchrun --nproc-per-node W`` and as W Tidal ranks
  (PID namespaces, the interposer loaded, Tidal's rendezvous store), no checkpoint in the window, for each
  workload of ``--workloads``: ``ddp`` (``benchmarks/ddp_steps.py``: an MLP, gloo on CPU, one line per step
  with the rank's clock), ``fsdp``, ``hsdp``, ``tp``, ``pipeline`` (``benchmarks/parallel_steps.py``: the
  modes of ``examples/parallel_train.py`` on a model of the same size, with the same step line). Runs of the
  two alternate, so both see the same machine; the step time of a run is its mean over the measured
  steps (the first ones, warm-up, are left out), the figure per setup the median over its runs.
* **Steps from a checkpoint request to the cut**, per workload. Checkpoints of a running W-rank job
  requested at seeded random moments: each rank's last step done at the request, by the step clock in its
  own lines (this machine's monotonic clock), against the last step in the output stored with the
  checkpoint (the output up to the dump). Also counted from the steps the ranks' logs showed at the request
  ("from the logs"), which lag behind by the time the output takes to reach them.
* **Pause of a W = 4 job checkpoint** (the job keeps running afterwards): from the request until every
  rank runs again (cut, freeze, dump, working directory), and the cut alone.
* **Start-up of a Python process** with and without the interposer's ``sitecustomize``.
* **The interposer's cost in the same processes** (``--only-paired B``, FSDP2 and the pipeline): one job trains
  the model on the interposer's group and a copy on a gloo group of torch's own, in turns of B steps
  (``parallel_steps.py --paired``), so that neighbouring blocks see the same machine; the same job under plain
  ``torchrun`` (two gloo groups of torch's) is the control, which must show nothing.

Run as root with CRIU provisioned (``make criu``). Prints a table and writes JSON (``--json FILE``).
Targets: overhead ≤ 1 %, cut within 2 steps, for every workload.
"""

from __future__ import annotations

import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import BenchmarkError, arguments, base_env, host_ranks, machine, run, say, wait_for, workspace, write_json
from tidal.errors import MechanismError, TidalError
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec
from tidal.mechanisms.interpose import SITE_DIR
from tidal.mechanisms.interpose.channel import cut, new_epoch, resume
from tidal.mechanisms.interpose.storeserver import RendezvousServer
from tidal.mechanisms.storage import CheckpointStore

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "ddp_steps.py"
PARALLEL = HERE / "parallel_steps.py"
#: The workloads (``--workloads``): the script and its arguments before ``--steps``. DDP uses only the world
#: group; the others add sub-groups (the dimensions of a DeviceMesh) and point-to-point (the pipeline).
WORKLOADS: dict[str, list[str]] = {
    "ddp": [str(WORKLOAD)],
    **{m: [str(PARALLEL), "--mode", m] for m in ("fsdp", "hsdp", "tp", "pipeline")},
}
LINE = re.compile(r"^rank (\d+) step (\d+) t ([0-9.]+) cpu ([0-9.]+) ", re.M)


def step_times(text: str) -> dict[int, float]:
    """step -> the rank's clock when it printed that step"""
    return {int(m[2]): float(m[3]) for m in LINE.finditer(text)}


def mean_step(text: str, warmup: int) -> float:
    t = step_times(text)
    last = max(t)
    return (t[last] - t[warmup]) / (last - warmup)


def cpu_step(text: str, warmup: int) -> float:
    """CPU time (all threads of rank 0's process) per step: what the interposer adds is CPU work, and CPU
    time is far less disturbed by other load on the machine than the wall clock."""
    c = {int(m[2]): float(m[4]) for m in LINE.finditer(text)}
    last = max(c)
    return (c[last] - c[warmup]) / (last - warmup)


def p10_step(text: str, warmup: int) -> float:
    """The 10th percentile of single step times: the undisturbed step, less sensitive to other load."""
    t = step_times(text)
    deltas = sorted(t[s] - t[s - 1] for s in range(warmup + 1, max(t) + 1))
    return deltas[len(deltas) // 10]


def last_step(text: str) -> int:
    steps = [int(m[2]) for m in LINE.finditer(text)]
    return steps[-1] if steps else -1


class Tidal:
    """Launches W-rank jobs as Tidal ranks on one node root, with Tidal's rendezvous store."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.server = RendezvousServer()
        self.store = CheckpointStore(str(base / "store"))
        self.node = NodeRoot("bench", base / "node")
        self.other = NodeRoot("bench-b", base / "node-b")  # the second node of a job spread over two
        self.launches = 0

    def launch_specs(self, world: int, args: list[str], workdir: Path,
                     workload: str = "ddp") -> tuple[str, list[RankSpec]]:
        self.launches += 1
        prefix = f"bench-{self.launches}"
        specs = [RankSpec(f"bench{self.launches}", r, (sys.executable, *WORKLOADS[workload], *args), workdir, {
            **base_env(), "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TIDAL_STORE": self.server.addr, "TIDAL_STORE_PREFIX": prefix,
        }) for r in range(world)]
        return specs[0].job_id, specs

    def launch(self, world: int, args: list[str], workdir: Path, workload: str = "ddp") -> tuple[Job, list[RankSpec]]:
        job_id, specs = self.launch_specs(world, args, workdir, workload)
        return Job.launch(job_id, [(s, self.node) for s in specs], self.store), specs

    def launch_spread(self, world: int, args: list[str], workdir: Path) -> list[Job]:
        """A W-rank job over two node roots, its first half of ranks on one, the rest on the other: what the
        agents of two nodes each hold of it (the first node keeps the working directory)."""
        job, specs = self.launch_specs(world, args, workdir)
        half = world // 2
        return [Job.launch(job, [(s, self.node) for s in specs[:half]], self.store),
                Job.launch(job, [(s, self.other) for s in specs[half:]], self.store, track_fs=False)]

    def run(self, world: int, args: list[str], workdir: Path, workload: str = "ddp") -> str:
        job, specs = self.launch(world, args, workdir, workload)
        status = job.wait(600)
        if any(not s.ok for s in status):
            raise MechanismError(f"Tidal ranks failed: {[str(s) for s in status]}: "
                                 f"{self.node.log_path(specs[0]).read_text()[-1000:]}",
                                 hint="the end of rank 0's output is above; `tidal doctor` checks the machine")
        return self.node.log_path(specs[0]).read_text()

    def close(self) -> None:
        self.server.close()


#: Reference ``torchrun`` runs that failed and were run again: (what, the end of its output), for the JSON.
RETRIED: list[dict[str, str]] = []


def torchrun(world: int, args: list[str], workdir: Path, workload: str = "ddp") -> str:
    """Rank 0's output of a plain ``torchrun`` run. A run that fails (a plain rank was seen aborting with SIGABRT
    on a busy machine) is reported and run once more, so that one crash does not lose the other figures."""
    for attempt in (1, 2):
        logs = workdir / "logs"
        shutil.rmtree(logs, ignore_errors=True)
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                              "--log-dir", str(logs), "--redirects", "3", *WORKLOADS[workload], *args],
                             cwd=workdir, env=base_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, timeout=600)
        if out.returncode == 0:
            (rank0,) = logs.glob("*/attempt_0/0/stdout.log")
            return rank0.read_text()
        tail = out.stderr[-1000:]
        if attempt == 1:
            say(f"the reference torchrun ({workload}, W={world}) failed with exit code {out.returncode}; running it "
                f"again. The end of its output:\n{tail}")
            RETRIED.append({"workload": workload, "world": str(world), "exit_code": str(out.returncode),
                            "output_tail": tail})
    raise BenchmarkError(f"the reference torchrun ({workload}, W={world}) failed twice: {tail}",
                         hint="the end of its output is above; the reference runs need torch (`make venv`)")


def interval(plain: list[float], ours: list[float], seed: int = 0, draws: int = 4000) -> tuple[float, float]:
    """A 90 % bootstrap interval of ``median(ours) / median(plain) - 1``: the runs of each side resampled with
    replacement. It says what the runs resolve: a 1 % target is shown met only if the interval's top is
    below it."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(ours, k=len(ours))) /
                    statistics.median(rng.choices(plain, k=len(plain))) - 1 for _ in range(draws))
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]


def overhead(tidal: Tidal, world: int, steps: int, reps: int, base: Path, workload: str = "ddp") -> dict[str, Any]:
    args = ["--steps", str(steps)]
    work = base / f"overhead-{workload}-w{world}"
    work.mkdir(parents=True, exist_ok=True)
    warmup = min(50, steps // 4)
    runs: dict[str, list[str]] = {"plain": [], "tidal": []}
    for i in range(reps):
        order = ("plain", "tidal") if i % 2 == 0 else ("tidal", "plain")
        for which in order:
            say(f"{workload} W={world}: run {i + 1} of {reps}, {which}")
            runs[which].append(torchrun(world, args, work, workload) if which == "plain"
                               else tidal.run(world, args, work, workload))
    plain = [mean_step(x, warmup) for x in runs["plain"]]
    ours = [mean_step(x, warmup) for x in runs["tidal"]]
    plain10 = [p10_step(x, warmup) for x in runs["plain"]]
    ours10 = [p10_step(x, warmup) for x in runs["tidal"]]
    plain_cpu = [cpu_step(x, warmup) for x in runs["plain"]]
    ours_cpu = [cpu_step(x, warmup) for x in runs["tidal"]]
    p, t = statistics.median(plain), statistics.median(ours)
    return {"workload": workload, "steps": steps, "measured_steps": steps - 1 - warmup, "reps": reps,
            "plain_step_s": plain, "tidal_step_s": ours, "plain_median_s": p, "tidal_median_s": t,
            "overhead_fraction": t / p - 1, "plain_p10_step_s": plain10, "tidal_p10_step_s": ours10,
            "overhead_fraction_p10": statistics.median(ours10) / statistics.median(plain10) - 1,
            "plain_cpu_step_s": plain_cpu, "tidal_cpu_step_s": ours_cpu,
            "cpu_overhead_fraction": statistics.median(ours_cpu) / statistics.median(plain_cpu) - 1,
            "overhead_interval90": interval(plain, ours), "cpu_overhead_interval90": interval(plain_cpu, ours_cpu),
            # How far apart runs of the very same setup were: the resolution of the comparison here.
            "plain_spread_fraction": (max(plain) - min(plain)) / p}


def span(iv: tuple[float, float]) -> str:
    """A 90 % interval of an overhead, in per cent."""
    return f"{iv[0] * 100:+.2f}..{iv[1] * 100:+.2f}%"


VIA = re.compile(r"^rank 0 step (\d+) t ([0-9.]+) cpu ([0-9.]+) .* via (default|native) thread ([0-9.]+)$", re.M)


def paired_blocks(text: str, block: int, warmup_blocks: int = 2) -> dict[str, Any]:
    """Rank 0's steps of a ``--paired`` run, by block of ``block`` steps (the first ``warmup_blocks`` left out):
    each block on the default group against the mean of the two native blocks around it, by wall clock, by
    the CPU time of the process and by that of the script's thread, per step; the median of those ratios and
    its 90 % bootstrap interval (the blocks resampled)."""
    lines = {int(m[1]): (float(m[2]), float(m[3]), float(m[5]), m[4]) for m in VIA.finditer(text)}
    blocks = []  # (via, wall, process CPU, the script thread's CPU), per step, of each whole block after the first
    for k in range(1, (max(lines) + 1) // block):
        first, last = k * block, k * block + block - 1
        missing = [s for s in (first - 1, last) if s not in lines]
        if missing:
            raise BenchmarkError(f"rank 0 printed no paired line for step {missing[0]}",
                                 hint="its lines end `via default|native thread SECONDS` (parallel_steps.py --paired)")
        blocks.append((lines[first][3], *((lines[last][i] - lines[first - 1][i]) / block for i in range(3))))
    out: dict[str, Any] = {"block": block, "blocks": len(blocks)}
    for i, what in ((1, "wall"), (2, "cpu"), (3, "thread_cpu")):
        ratios = [b[i] / ((blocks[k - 1][i] + blocks[k + 1][i]) / 2) for k, b in enumerate(blocks)
                  if k >= warmup_blocks and b[0] == "default" and k + 1 < len(blocks)]
        rng = random.Random(0)
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(4000))
        out[what] = {**{f"{via}_step_s": statistics.median(b[i] for b in blocks[warmup_blocks:] if b[0] == via)
                        for via in ("default", "native")},
                     "pairs": len(ratios), "overhead_fraction": statistics.median(ratios) - 1,
                     "interval90": (boot[200] - 1, boot[3799] - 1)}
    return out


def paired(tidal: Tidal, world: int, steps: int, block: int, base: Path, workload: str) -> dict[str, Any]:
    """The interposer's cost to a workload, measured in the same processes (``parallel_steps.py --paired``):
    under Tidal, the model on the interposer's group against a copy on a gloo group of torch's own; under plain
    ``torchrun``, the same with two gloo groups of torch's, the control, which must show none."""
    work = base / f"paired-{workload}-w{world}"
    work.mkdir(parents=True, exist_ok=True)
    args = ["--steps", str(steps), "--paired", str(block)]
    say(f"{workload} W={world}: paired, as Tidal ranks")
    ours = tidal.run(world, args, work, workload)
    say(f"{workload} W={world}: paired, under torchrun (the control)")
    control = torchrun(world, args, work, workload)
    return {"workload": workload, "world": world, "steps": steps, "tidal": paired_blocks(ours, block),
            "control": paired_blocks(control, block)}


def print_paired(by: dict[str, dict[str, Any]]) -> None:
    print(f"{'workload':>9} {'W':>3} {'setup':>9} {'pairs':>6} {'step ms default':>16} {'native':>7} "
          f"{'overhead':>9} {'90 % interval':>17} {'CPU ms default':>15} {'native':>7} {'CPU overhead':>13} "
          f"{'90 % interval':>17} {'script thread CPU overhead':>27} {'90 % interval':>17}")
    for r in by.values():
        for setup in ("tidal", "control"):
            b = r[setup]
            w, c, th = b["wall"], b["cpu"], b["thread_cpu"]
            print(f"{r['workload']:>9} {r['world']:>3} {setup:>9} {w['pairs']:>6} {w['default_step_s'] * 1e3:>16.2f} "
                  f"{w['native_step_s'] * 1e3:>7.2f} {w['overhead_fraction'] * 100:>8.2f}% {span(w['interval90']):>17} "
                  f"{c['default_step_s'] * 1e3:>15.3f} {c['native_step_s'] * 1e3:>7.3f} "
                  f"{c['overhead_fraction'] * 100:>12.2f}% {span(c['interval90']):>17} "
                  f"{th['overhead_fraction'] * 100:>26.2f}% {span(th['interval90']):>17}")


def cuts(tidal: Tidal, world: int, requests: int, seed: int, base: Path, workload: str = "ddp",
         cut_timeout: float = 30.0) -> dict[str, Any]:
    """Checkpoints (the job goes on) at seeded random moments; steps from each request to its cut; the pause."""
    work = base / f"cut-{workload}-w{world}"
    work.mkdir(parents=True, exist_ok=True)
    job, specs = tidal.launch(world, ["--steps", "1000000"], work, workload)
    logs = [tidal.node.log_path(s) for s in specs]
    rng = random.Random(seed)
    steps_to_cut: list[int] = []
    from_logs: list[int] = []  # the same, counted from the steps the logs showed at the request
    pauses: list[float] = []
    dumps: list[float] = []
    cut_only: list[float] = []
    failed: list[dict[str, Any]] = []
    # A request that does not reach its cut within this fails (the job goes on): a result, counted as such.
    job.cut_timeout = cut_timeout
    try:
        wait_for(lambda: min(last_step(p.read_text()) for p in logs) >= 20, 300, "the job to train")
        channel = job.channels()[0]
        channel.last_stat = None
        channel.request_stat()
        wait_for(lambda: channel.last_stat is not None, 30, "the rank's progress")
        stat = channel.last_stat
        assert stat is not None
        per_step = stat["collectives"] / max(1, stat["steps"])
        for i in range(requests):
            say(f"{workload} W={world}: checkpoint request {i + 1} of {requests}")
            # A random moment: a random rank reaches a random step 1..15 ahead of where it was.
            r = rng.randrange(world)
            target = last_step(logs[r].read_text()) + rng.randint(1, 15)
            wait_for(lambda r=r, target=target: last_step(logs[r].read_text()) >= target, 120, "a step")
            before = [last_step(p.read_text()) for p in logs]
            requested = time.perf_counter()  # the ranks' step clock is this machine's monotonic clock too
            try:
                info = job.checkpoint(then="continue", keep=1)
            except TidalError as exc:
                say(f"{workload} W={world}: checkpoint request {i + 1} failed: {exc}")
                failed.append({"request": i, "steps_at_request": before, "error": str(exc),
                               "steps_after": [last_step(p.read_text()) for p in logs]})
                continue
            assert job.last_timing is not None
            pauses.append(job.last_timing.pause_s)
            dumps.append(job.last_timing.dump_s)
            reader = tidal.store.reader(specs[0].job_id, info.id)
            outputs = [reader.read_bytes(f"ranks/{s.rank}/output.log").decode() for s in specs]
            at_cut = [last_step(text) for text in outputs]
            # Each rank's last step done at the request, by its own clock: what its log showed then lags by
            # however long the output took to reach the log (the agent's pump, on a busy machine).
            at_request = [max((n for n, t in step_times(text).items() if t <= requested), default=-1)
                          for text in outputs]
            steps_to_cut.append(max(a - b for a, b in zip(at_cut, at_request, strict=True)))
            from_logs.append(max(a - b for a, b in zip(at_cut, before, strict=True)))
            # The cut alone (no dump): request, park every rank, tear the groups down; then let them go on.
            epoch = new_epoch()
            t = time.perf_counter()
            try:
                cut(job.channels(), epoch, cut_timeout)
            except TidalError as exc:  # cut() has let every rank go on
                say(f"{workload} W={world}: the cut alone after request {i + 1} failed: {exc}")
                failed.append({"request": i, "cut_alone": True, "error": str(exc)})
                continue
            cut_only.append(time.perf_counter() - t)
            resume(job.channels(), epoch, None, wait=True)
    finally:
        job.kill()

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return {"workload": workload, "collectives_per_step": per_step, "requests": requests, "steps_to_cut": steps_to_cut,
            # None when no request reached its cut; failed requests are in "failed", never in the maximum.
            "steps_to_cut_max": max(steps_to_cut, default=None), "steps_to_cut_from_logs": from_logs,
            "steps_to_cut_from_logs_max": max(from_logs, default=None), "failed": failed,
            "failed_requests": len([f for f in failed if not f.get("cut_alone")]),
            "pause_s": pauses, "pause_median_s": med(pauses), "pause_max_s": max(pauses, default=None),
            "dump_s": dumps, "cut_s": cut_only, "cut_median_s": med(cut_only)}


def checkpoint_over_nodes(jobs: list[Job], checkpoint_id: str) -> dict[str, float]:
    """One checkpoint of a job spread over nodes (the job goes on), driven as its nodes' agents drive it, every
    node at once: counts → park → checkpoint at the cut. The control plane's answer → order round trip between
    two steps is not in it (one per step: the cut's counts, the park). Times from the request: ``cut_s`` until
    every rank is parked, ``pause_s`` until every rank runs again (each node's ranks go on once that node has
    dumped them), ``held_s`` until every part is committed: when the ranks went on before they went on at
    once."""
    epoch = new_epoch()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        counted = [r.counts for r in pool.map(lambda j: j.report(epoch), jobs)]
        target = max(n for c in counted for n in c.values())
        list(pool.map(lambda j: j.park(epoch, target), jobs))
        t_parked = time.perf_counter()

        def dump(job: Job, part: str) -> float:
            t = time.perf_counter()
            job.checkpoint(then="continue", checkpoint_id=part, cut_at=(epoch, target))
            assert job.last_timing is not None
            return t + job.last_timing.pause_s  # this node's ranks run again from here

        resumed = list(pool.map(dump, jobs, [f"{checkpoint_id}.p{k}" for k in range(len(jobs))]))
    t_end = time.perf_counter()
    for j in jobs:
        j.release()  # nothing is held any more: a no-op, as the control plane's last step is
    timings = [j.last_timing for j in jobs]
    assert all(t is not None for t in timings)
    return {"cut_s": t_parked - t0, "pause_s": max(resumed) - t0, "held_s": t_end - t0,
            "dump_s": max(t.dump_s for t in timings if t), "commit_s": max(t.commit_s for t in timings if t)}


def one_and_two_nodes(tidal: Tidal, rounds: int, per_job: int, seed: int, base: Path) -> dict[str, Any]:
    """The pause of a W = 4 job checkpoint (the job goes on) on one node and spread over two (ranks 0-1 and
    2-3), in alternating rounds, each a fresh job with ``per_job`` checkpoints at seeded random moments."""
    world = 4
    rng = random.Random(seed)
    one: dict[str, list[float]] = {"pause_s": [], "dump_s": [], "commit_s": []}
    two: dict[str, list[float]] = {"cut_s": [], "pause_s": [], "held_s": [], "dump_s": [], "commit_s": []}
    for i in range(rounds):
        for where in ("one node", "two nodes"):
            work = base / f"nodes-{i}-{where.replace(' ', '-')}"
            work.mkdir(parents=True, exist_ok=True)
            if where == "one node":
                jobs = [tidal.launch(world, ["--steps", "1000000"], work)[0]]
            else:
                jobs = tidal.launch_spread(world, ["--steps", "1000000"], work)
            logs = [r.node.log_path(r.spec) for j in jobs for r in j.ranks]
            try:
                wait_for(lambda logs=logs: min(last_step(p.read_text()) for p in logs) >= 20, 300,
                         "the job to train")
                for k in range(per_job):
                    say(f"round {i + 1} of {rounds}, {where}: checkpoint {k + 1} of {per_job}")
                    r = rng.randrange(world)
                    target = last_step(logs[r].read_text()) + rng.randint(1, 15)
                    wait_for(lambda p=logs[r], target=target: last_step(p.read_text()) >= target, 120, "a step")
                    if where == "one node":
                        jobs[0].checkpoint(then="continue", keep=1)
                        t = jobs[0].last_timing
                        assert t is not None
                        for key, v in (("pause_s", t.pause_s), ("dump_s", t.dump_s), ("commit_s", t.commit_s)):
                            one[key].append(v)
                    else:
                        for key, v in checkpoint_over_nodes(jobs, f"ck-{i}-{k}").items():
                            two[key].append(v)
            finally:
                for j in jobs:
                    j.kill()
    m1, m2 = statistics.median(one["pause_s"]), statistics.median(two["pause_s"])
    return {"world": world, "rounds": rounds, "per_job": per_job, "one_node": one, "two_nodes": two,
            "one_node_pause_median_s": m1, "two_nodes_pause_median_s": m2,
            "two_nodes_held_median_s": statistics.median(two["held_s"]), "two_over_one": m2 / m1}


def probe(tidal: Tidal, calls: int, base: Path) -> dict[str, Any]:
    """The interposer's own cost per op, measured in the ranks of one W = 2 job (see ddp_steps.py): per kind
    (``collective``, ``p2p``) the wall and CPU time per op through it and on a gloo group of torch's own;
    ``added_s``, the larger of the two kinds' added CPU, is what the estimates below multiply."""
    work = base / "probe"
    work.mkdir(parents=True, exist_ok=True)
    out = tidal.run(2, ["--steps", "1", "--probe", str(calls)], work)
    kinds: dict[str, dict[str, float]] = {}
    for m in re.finditer(r"^probe (\w+) through_us ([0-9.]+) native_us ([0-9.]+) through_cpu_us ([0-9.]+) "
                         r"native_cpu_us ([0-9.]+)$", out, re.M):
        through, native, through_cpu, native_cpu = (float(m[i]) * 1e-6 for i in range(2, 6))
        kinds[m[1]] = {"through_s": through, "native_s": native, "through_cpu_s": through_cpu,
                       "native_cpu_s": native_cpu, "added_s": through_cpu - native_cpu}
    if set(kinds) != {"collective", "p2p"}:
        raise BenchmarkError(f"no probe result in {out[-500:]!r}",
                             hint="benchmarks/ddp_steps.py --probe prints one per kind; see the output above")
    return {"calls": calls, "kinds": kinds, "added_s": max(k["added_s"] for k in kinds.values())}


def startup(reps: int) -> dict[str, Any]:
    """``python -c pass`` started as a rank's first Python process would be, with and without the
    interposer: its wall time and its CPU time (user + system, less disturbed by other load). Bytecode
    caching is on, as after an ordinary installation (a first run writes the interposer's)."""
    wall: dict[str, list[float]] = {"plain": [], "tidal": []}
    cpu: dict[str, list[float]] = {"plain": [], "tidal": []}
    for i in range(reps + 1):
        for which in (("plain", "tidal") if i % 2 == 0 else ("tidal", "plain")):
            env = base_env()
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            fds: tuple[int, ...] = ()
            if which == "tidal":
                req_r, req_w = os.pipe()
                rep_r, rep_w = os.pipe()
                env["PYTHONPATH"] = str(SITE_DIR)
                env["TIDAL_INTERPOSE_CTL"] = f"{req_r},{rep_w}"
                fds = (req_r, rep_w)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, pass_fds=fds, check=True)
            elapsed = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if i > 0:  # the first round warms the caches
                wall[which].append(elapsed)
                cpu[which].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if which == "tidal":
                os.close(rep_w)
                assert b'"hello"' in os.read(rep_r, 4096)
                for fd in (req_r, req_w, rep_r):
                    os.close(fd)
    med = {k: {w: statistics.median(v[w]) for w in ("plain", "tidal")} for k, v in (("wall", wall), ("cpu", cpu))}
    return {"reps": reps, "plain_median_s": med["wall"]["plain"], "tidal_median_s": med["wall"]["tidal"],
            "plain_cpu_median_s": med["cpu"]["plain"], "tidal_cpu_median_s": med["cpu"]["tidal"],
            "added_s": med["wall"]["tidal"] - med["wall"]["plain"],
            "added_cpu_s": med["cpu"]["tidal"] - med["cpu"]["plain"]}


def print_machine(m: dict[str, Any]) -> None:
    print(f"machine: {m['cpu']}, {m['cores']} cores, kernel {m['kernel']}, CRIU {m['criu']}, torch {m['torch']}, "
          f"load average {m['load_average_at_start'][0]:.2f} at start, {m['load_average_at_end'][0]:.2f} at end")


def print_nodes(n: dict[str, Any]) -> None:
    med = statistics.median
    one, two = n["one_node"], n["two_nodes"]
    print(f"checkpoint pause of a W = {n['world']} job that goes on, {len(one['pause_s'])} checkpoints each "
          "(medians; two nodes: as their agents drive it, without the control plane's round trips)")
    print(f"{'':>10} {'pause s':>8} {'cut s':>6} {'dump s':>7} {'commit s':>9} {'held until committed s':>23}")
    print(f"{'one node':>10} {med(one['pause_s']):>8.3f} {'':>6} {med(one['dump_s']):>7.3f} "
          f"{med(one['commit_s']):>9.3f} {'':>23}")
    print(f"{'two nodes':>10} {med(two['pause_s']):>8.3f} {med(two['cut_s']):>6.3f} {med(two['dump_s']):>7.3f} "
          f"{med(two['commit_s']):>9.3f} {med(two['held_s']):>23.3f}")
    print(f"two nodes / one node: {n['two_over_one']:.2f}x (target ≤ 1.3x); held until every part is committed: "
          f"{n['two_nodes_held_median_s'] / n['one_node_pause_median_s']:.2f}x")


def print_overheads(by: dict[str, Any]) -> None:
    """The steady-state comparison's table, a row per workload and world size."""
    print(f"{'workload':>9} {'W':>3} {'torchrun step ms':>17} {'Tidal step ms':>14} {'overhead':>9} "
          f"{'90 % interval':>17} {'CPU/step torchrun ms':>21} {'Tidal ms':>9} {'CPU overhead':>13} "
          f"{'90 % interval':>17} {'runs':>5} {'spread of torchrun runs':>24}")
    for wl, r in by.items():
        for w, o in r["overhead"].items():
            print(f"{wl:>9} {w:>3} {o['plain_median_s'] * 1e3:>17.2f} {o['tidal_median_s'] * 1e3:>14.2f} "
                  f"{o['overhead_fraction'] * 100:>8.2f}% {span(o['overhead_interval90']):>17} "
                  f"{statistics.median(o['plain_cpu_step_s']) * 1e3:>21.2f} "
                  f"{statistics.median(o['tidal_cpu_step_s']) * 1e3:>9.2f} "
                  f"{o['cpu_overhead_fraction'] * 100:>12.2f}% {span(o['cpu_overhead_interval90']):>17} {o['reps']:>5} "
                  f"{o['plain_spread_fraction'] * 100:>23.1f}%")
    for wl, r in by.items():
        for w, why in r["overhead_failed"].items():
            print(f"{wl} W={w}: no overhead figure ({why})")


def finish_early(out: dict[str, Any], json_path: Any, show: Callable[[], None]) -> int:
    """The end of a run of one part only (``--only-…``): the machine, that part's figures, the JSON."""
    out["machine"]["load_average_at_end"] = os.getloadavg()
    print_machine(out["machine"])
    show()
    write_json(json_path, out)
    return 0


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench-interpose")
    p.add_argument("--worlds", default="2,4", help="world sizes for the overhead comparison")
    p.add_argument("--workloads", default="ddp,fsdp,pipeline",
                   help=f"workloads for the overhead and steps-to-cut figures, of {','.join(WORKLOADS)}")
    p.add_argument("--steps", type=int, default=400, help="steps per overhead run")
    p.add_argument("--reps", type=int, default=4, help="runs of each setup per world size")
    p.add_argument("--requests", type=int, default=8, help="checkpoint requests per world size")
    p.add_argument("--seed", type=int, default=4)
    p.add_argument("--cut-timeout", type=float, default=30.0,
                   help="seconds a checkpoint request may take to reach its cut (as the agent's default)")
    p.add_argument("--node-rounds", type=int, default=4,
                   help="rounds of the one-node / two-node checkpoint pause comparison (a fresh job each, 2 "
                        "checkpoints; 0: none)")
    p.add_argument("--only-nodes", action="store_true",
                   help="only the one-node / two-node checkpoint pause comparison")
    p.add_argument("--only-overhead", action="store_true",
                   help="only the steady-state overhead comparison (no probe, checkpoints or pauses)")
    p.add_argument("--only-paired", type=int, default=0, metavar="B",
                   help="only the in-process comparison of fsdp and pipeline: one Tidal job and one torchrun job per "
                        "workload and world size, the model trained on the default group and on a gloo group of "
                        "torch's own in turns of B steps (--steps in all)")
    p.add_argument("--only-probe", type=int, default=0, metavar="N",
                   help="only the per-op probe, N times over (a fresh W = 2 job each): its spread from job to job")
    args = p.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise BenchmarkError(f"unknown workloads {unknown}", hint=f"choose among {', '.join(WORKLOADS)}")
    host_ranks()
    # "overhead", "overhead_failed" and "cut" hold the DDP figures by world size (as before there were others);
    # "workloads" holds every workload's, DDP's included.
    out: dict[str, Any] = {"machine": machine(with_torch=True), "overhead": {}, "overhead_failed": {}, "cut": {},
                           "workloads": {w: {"overhead": {}, "overhead_failed": {}, "cut": {}} for w in workloads},
                           "torchrun_retried": RETRIED}
    if "ddp" in workloads:
        out["workloads"]["ddp"] = {"overhead": out["overhead"], "overhead_failed": out["overhead_failed"],
                                   "cut": out["cut"]}
    with workspace(args.dir) as base:
        tidal = Tidal(base)
        try:
            if args.only_nodes:
                out["nodes"] = one_and_two_nodes(tidal, args.node_rounds, 2, args.seed, base)
                return finish_early(out, args.json, lambda: print_nodes(out["nodes"]))
            if args.only_paired:
                pairs = {f"{wl}-w{w}": paired(tidal, w, args.steps, args.only_paired, base, wl)
                         for w in worlds for wl in workloads if wl in ("fsdp", "pipeline")}
                out["paired"] = pairs
                return finish_early(out, args.json, lambda: print_paired(pairs))
            if args.only_probe:
                runs = [probe(tidal, 4000, base) for _ in range(args.only_probe)]
                out["probes"] = runs

                def show_probes() -> None:
                    for r in runs:
                        print(" ".join(f"{kind}: +{k['added_s'] * 1e6:.1f} us CPU ({k['through_cpu_s'] * 1e6:.1f} "
                                       f"against {k['native_cpu_s'] * 1e6:.1f})" for kind, k in r["kinds"].items()))
                return finish_early(out, args.json, show_probes)
            if not args.only_overhead:
                out["startup"] = startup(20)
                out["probe"] = probe(tidal, 4000, base)
            for w in worlds:
                for wl in workloads:
                    try:
                        out["workloads"][wl]["overhead"][str(w)] = overhead(tidal, w, args.steps, args.reps, base, wl)
                    except BenchmarkError as exc:  # the other figures are kept
                        say(f"{wl} W={w}: no overhead figure: {exc}")
                        out["workloads"][wl]["overhead_failed"][str(w)] = str(exc)
            if args.only_overhead:
                return finish_early(out, args.json, lambda: print_overheads(out["workloads"]))
            for wl in workloads:
                # DDP at W = 2 as well: its collectives per step scale the probe's figure below.
                for w in sorted({2, 4} | set(worlds)) if wl == "ddp" else worlds:
                    out["workloads"][wl]["cut"][str(w)] = cuts(tidal, w, args.requests, args.seed + w, base, wl,
                                                               args.cut_timeout)
            if args.node_rounds and not args.only_overhead:
                out["nodes"] = one_and_two_nodes(tidal, args.node_rounds, 2, args.seed, base)
        finally:
            tidal.close()
    out["machine"]["load_average_at_end"] = os.getloadavg()
    by = out["workloads"]
    out["overhead_fraction_by_workload"] = {
        wl: max((o["overhead_fraction"] for o in r["overhead"].values()), default=None) for wl, r in by.items()}
    out["cpu_overhead_fraction_by_workload"] = {
        wl: max((o["cpu_overhead_fraction"] for o in r["overhead"].values()), default=None) for wl, r in by.items()}
    out["steps_to_cut_max_by_workload"] = {
        wl: max((c["steps_to_cut_max"] for c in r["cut"].values() if c["steps_to_cut_max"] is not None), default=None)
        for wl, r in by.items()}
    out["failed_requests_by_workload"] = {wl: sum(c["failed_requests"] for c in r["cut"].values())
                                          for wl, r in by.items()}
    out["steps_to_cut_max_all"] = max((v for v in out["steps_to_cut_max_by_workload"].values() if v is not None),
                                      default=None)
    if "ddp" in workloads:
        out["overhead_fraction"] = out["overhead_fraction_by_workload"]["ddp"]
        out["cpu_overhead_fraction"] = out["cpu_overhead_fraction_by_workload"]["ddp"]
        out["steps_to_cut_max"] = out["steps_to_cut_max_by_workload"]["ddp"]
        out["job_pause_s"] = out["cut"]["4"]["pause_median_s"]
        out["job_pause_max_s"] = out["cut"]["4"]["pause_max_s"]
        out["cut_s"] = out["cut"]["4"]["cut_median_s"]
        # The interposer's own cost per step: its added cost per collective times the collectives of a step,
        # against the step time (the paired measurement, free of the run-to-run noise of the comparison).
        per_step = out["cut"]["2"]["collectives_per_step"]
        out["overhead_fraction_from_probe"] = {
            w: out["probe"]["added_s"] * per_step / o["plain_median_s"] for w, o in out["overhead"].items()}
    # The same estimate for every workload: its own ops per step (collectives and point-to-point, as the
    # interposer counts them in its cut run) against its torchrun step time, per world size measured both ways.
    out["overhead_fraction_from_probe_by_workload"] = {
        wl: {w: out["probe"]["added_s"] * r["cut"][w]["collectives_per_step"] / o["plain_median_s"]
             for w, o in r["overhead"].items() if w in r["cut"]} for wl, r in by.items()}
    out["startup_added_s"] = out["startup"]["added_s"]
    out["startup_added_cpu_s"] = out["startup"]["added_cpu_s"]
    print_machine(out["machine"])

    print_overheads(by)

    def num(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    print(f"{'workload':>9} {'W':>3} {'requests':>9} {'no cut':>7} {'steps to cut (max: each)':>26} "
          f"{'from the logs':>20} {'ops per step':>13} {'pause median s':>15} {'pause max s':>12} {'cut alone s':>12}")
    for wl, r in by.items():
        for w, c in r["cut"].items():
            each = f"{num(c['steps_to_cut_max'], 'd')}: {','.join(map(str, c['steps_to_cut']))}"
            logs = f"{num(c['steps_to_cut_from_logs_max'], 'd')}: {','.join(map(str, c['steps_to_cut_from_logs']))}"
            print(f"{wl:>9} {w:>3} {c['requests']:>9} {c['failed_requests']:>7} {each:>26} {logs:>20} "
                  f"{c['collectives_per_step']:>13.1f} {num(c['pause_median_s'], '.3f'):>15} "
                  f"{num(c['pause_max_s'], '.3f'):>12} {num(c['cut_median_s'], '.3f'):>12}")
    if "nodes" in out:
        print_nodes(out["nodes"])
    print("the interposer's own cost per step estimated from the probe below (its added CPU per op × ops per step / "
          "torchrun's step): " + "; ".join(f"{wl} W={w}: {f * 100:.3f} %" for wl, e in
                                           out["overhead_fraction_from_probe_by_workload"].items()
                                           for w, f in e.items()))
    pr = out["probe"]
    print(f"per op (W = 2, {pr['calls']} each, paired with a gloo group of torch's own in the same processes): " +
          "; ".join(f"{kind}: wall {k['through_s'] * 1e6:.1f} us through the interposer, {k['native_s'] * 1e6:.1f} us "
                    f"native; CPU of the calling thread {k['through_cpu_s'] * 1e6:.1f} us against "
                    f"{k['native_cpu_s'] * 1e6:.1f} us (+{k['added_s'] * 1e6:.1f} us)"
                    for kind, k in pr["kinds"].items())
          + ("" if "ddp" not in workloads else
             f"; DDP: {per_step:.2f} collectives per step → " + ", ".join(
                 f"W={w}: {f * 100:.3f} % of a step" for w, f in out["overhead_fraction_from_probe"].items())))
    s = out["startup"]
    print(f"python start-up: wall {s['plain_median_s'] * 1e3:.1f} ms plain, {s['tidal_median_s'] * 1e3:.1f} ms with "
          f"the interposer (+{s['added_s'] * 1e3:.1f} ms); CPU {s['plain_cpu_median_s'] * 1e3:.1f} ms against "
          f"{s['tidal_cpu_median_s'] * 1e3:.1f} ms (+{s['added_cpu_s'] * 1e3:.1f} ms)")
    for rt in RETRIED:
        print(f"a reference torchrun ({rt['workload']}, W={rt['world']}) failed once (exit code {rt['exit_code']}) "
              "and was run again")
    for wl in workloads:
        frac = out["overhead_fraction_by_workload"][wl]
        nocut = out["failed_requests_by_workload"][wl]
        print(f"{wl}: overhead_fraction {'none' if frac is None else f'{frac:.4f}'} (target ≤ 0.01), "
              f"steps_to_cut_max {out['steps_to_cut_max_by_workload'][wl]} (target ≤ 2)"
              + (f", {nocut} requests never reached their cut" if nocut else ""))
    if "ddp" in workloads:
        print(f"job_pause_s {num(out['job_pause_s'], '.3f')} (DDP, W = 4)")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
