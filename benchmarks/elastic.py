#!/usr/bin/env python3
"""Elastic resize benchmark: one W = 4 DDP job resized 4 → 2 → 1 → 4 → 1 → 2 → 4 devices, in one run.

The job is ``examples/ddp_train.py`` (an ordinary DDP script, gloo on CPU, one line per step) run as four
Tidal ranks. A resize is what ``tidal resize`` does on one node: a consistent cut, a checkpoint of every
rank (then killed), a restore with the new packing (rank r on device ``r * D // 4``, ranks sharing a device
share its CPUs) and a new rendezvous. Measured:

* **Throughput** (steps/s) on each D: the job's step lines over a timed window after a warm-up, from a
  poller that notes when each step line first appears (host clock). The sequence visits every D at
  windows placed symmetrically in time (4 at the start, middle and end; 2 and 1 twice each), so a slow
  drift of the machine's other load weighs on every D alike.
* **Per-device efficiency** relative to the 4-device run: (steps/s on D) / D against (steps/s on 4) / 4;
  1.0 is linear. Also in CPU terms: the job's CPU-seconds per step on 4 devices against those on D.
* **Resize pause**: the gap in the step lines across a resize: from the last step line before the cut
  to the moment every rank has printed a step after the restore (one normal step of that interval is
  training, not pause: the step interval is reported beside it); with the checkpoint and the restore
  apart. By default the restore starts from the images dumped on the node while the commit to the store
  runs in the background (``--restore-from local``); ``--restore-from store`` restores from the store once
  committed, ``both`` alternates the two in one run and reports their medians side by side.
* **Time-slicing overhead**, comparable to Singularity's +1.4 … +5.6 % for 4 ranks time-sliced on one
  GPU: the 4 ranks on one device against the work of the same 4 ranks done one after another on that
  device. The fair baseline on CPU is the *work* of the 4 ranks in the 4-device run, where every rank has
  a device of its own: their CPU-seconds per step summed (each rank's compute plus its share of the
  collectives, measured per thread from ``/proc/PID/task/TID/schedstat``). Done one after another on one
  device of capacity c (CPU-seconds per second) that work takes work / c seconds per step. Against it:
  (a) ``timeslice_overhead_cpu``, the job's CPU-seconds per step on 1 device over those on 4 devices − 1:
      what time-slicing adds to the work itself (context switches, cold caches, waking peers);
  (b) ``timeslice_overhead_wall``, the step interval on 1 device × c over the baseline work − 1: the same
      plus every moment the device was not running the job, whether the ranks left it idle or other
      processes on the machine took it (an upper bound on a shared machine; the share of its device the
      job obtained is reported with it);
  (c) ``timeslice_overhead_vs_dedicated``, the plain ratio against dedicated devices, (steps/s on 4) /
      (4 × steps/s on 1) − 1 = 1 / efficiency(1) − 1. Always (c) ≤ (b): every moment a dedicated device
      does not run its rank (waiting for its peers, or taken by other processes) lengthens the 4-device
      step and so the baseline of (c), while (b) counts only the work.

On a machine shared with other work, the wall-clock figures (throughput, efficiency per device, (b), (c))
measure the devices' share of the machine as much as the job: a device that obtained only part of its
CPU share (``share got``: the job's CPU-seconds over its devices' capacity in the window) slowed down for
that reason alone. The CPU-accounted figures (CPU ms per step, efficiency (CPU), (a)) depend on it far
less (only through caches and memory bandwidth shared with the other processes).

**Devices.** A device is what Tidal's agent makes of a CPU node with 4 devices (``tidal.agent.devices``):
with at least 4 cores, a disjoint CPU set each; with fewer (the usual case of a small test machine),
devices take the cores round-robin and each gets a CPU quota of cores / 4 through a cgroup v1 cpu
controller. On 2 cores a device is half a core (CFS quota 50 ms per 100 ms, pinned to core i mod 2):
D = 4 uses both cores, D = 2 one device on each core (one core's worth of CPU in all), D = 1 half of
core 0. Every D thus runs on devices of the same size and per-device efficiency compares like with like.
The benchmark's device cgroups sit at the top of the cpu hierarchy, so that each device competes with
the machine's other processes like one process would (nested under one parent, all devices together
would weigh as one process). The output states the cores, the device size and the machine's load:
its busy cores and the CPU taken by processes other than the job during each window.

Run as root with CRIU provisioned (``make criu``). Prints a table and writes JSON (``--json FILE``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import BenchmarkError, arguments, base_env, host_ranks, machine, run, say, wait_for, workspace, write_json
from tidal.agent.devices import cpu_sets
from tidal.core.view import rank_map
from tidal.errors import ConfigError
from tidal.mechanisms.criu import tasks
from tidal.mechanisms.criu.cgroups import PERIOD_US
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec
from tidal.mechanisms.interpose.channel import Store
from tidal.mechanisms.interpose.storeserver import RendezvousServer
from tidal.mechanisms.storage import CheckpointStore

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"
WORLD = 4
NODE_DEVICES = 4
STEP = re.compile(rb"rank (\d+) step (\d+) ")
JOB_ID = "elastic"
ROOT = Path("/sys/fs/cgroup")  # the cgroup v1 controllers (a device's CPU quota: cpu/)


# -- devices ------------------------------------------------------------------------------------------------
class Devices:
    """The node's 4 devices as the agent makes them: CPU sets, and a CPU quota each when cores < 4."""

    def __init__(self) -> None:
        self.cores = sorted(os.sched_getaffinity(0))
        self.cpus = cpu_sets(NODE_DEVICES, self.cores)
        self.share = min(len(c) for c in self.cpus) if len(self.cores) >= NODE_DEVICES \
            else len(self.cores) / NODE_DEVICES
        self.quota = len(self.cores) < NODE_DEVICES
        self.paths = [ROOT / "cpu" / f"tidal-bench-elastic-dev{i}" for i in range(NODE_DEVICES)]
        if self.quota:
            if not (ROOT / "cpu" / "cgroup.procs").exists():
                raise ConfigError(f"{len(self.cores)} cores for {NODE_DEVICES} devices needs the cgroup v1 cpu "
                                  f"controller at {ROOT / 'cpu'}",
                                  hint=f"mount it: mkdir -p {ROOT / 'cpu'} && mount -t cgroup -o cpu cgroup "
                                       f"{ROOT / 'cpu'}; or run on a machine with {NODE_DEVICES} cores or more")
            for p in self.paths:
                p.mkdir(exist_ok=True)
                (p / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (p / "cpu.cfs_quota_us").write_text(str(int(self.share * PERIOD_US)))

    def place(self, device: int, root_pid: int) -> None:
        if not self.quota:
            return
        for pid in tasks.descendants(root_pid):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError, OSError):
                (self.paths[device] / "cgroup.procs").write_text(str(pid))

    def describe(self) -> dict[str, Any]:
        return {"node_devices": NODE_DEVICES, "cores": self.cores, "device_cpus": self.cpus,
                "device_share_cpu": self.share, "cpu_quota": self.quota,
                "packing": {str(d): [r * d // WORLD for r in range(WORLD)] for d in (1, 2, 4)}}

    def close(self) -> None:
        for p in self.paths:
            with contextlib.suppress(OSError):
                p.rmdir()


# -- observation --------------------------------------------------------------------------------------------
class Poller:
    """Notes, on the host clock, when each rank's log first shows each step (reads only the log's tail)."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.logs: list[Path] = []
        self.seen: list[dict[int, float]] = [{} for _ in range(WORLD)]
        self.last = [-1] * WORLD
        self.mu = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="poller")

    def watch(self, logs: list[Path]) -> None:
        with self.mu:
            self.logs = logs

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            now = time.perf_counter()
            with self.mu:
                logs = list(self.logs)
            for r, path in enumerate(logs):
                try:
                    with open(path, "rb") as f:
                        f.seek(0, os.SEEK_END)
                        size = f.tell()
                        f.seek(max(0, size - 512))
                        tail = f.read()
                except FileNotFoundError:
                    continue
                steps = [int(m[2]) for m in STEP.finditer(tail)]
                if steps and steps[-1] > self.last[r]:
                    with self.mu:
                        for s in range(self.last[r] + 1, steps[-1] + 1):
                            self.seen[r].setdefault(s, now)
                        self.last[r] = steps[-1]

    def step(self, rank: int = 0) -> int:
        with self.mu:
            return self.last[rank]

    def all_past(self, step: int) -> bool:
        with self.mu:
            return min(self.last) > step

    def when(self, rank: int, step: int) -> float:
        with self.mu:
            return self.seen[rank][step]


def job_cpu(job: Job) -> tuple[float, float, int]:
    """(CPU-seconds, seconds waiting on a run queue, context switches) of every thread of every process of
    the job's ranks."""
    cpu = wait = switches = 0
    for rp in job.ranks:
        for pid in tasks.descendants(rp.pid):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                        a, b, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                        cpu += int(a)
                        wait += int(b)
                        switches += sum(int(ln.split()[1]) for ln in
                                        Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
                                        if "ctxt_switches:" in ln)
    return cpu / 1e9, wait / 1e9, switches


def core_busy() -> dict[int, float]:
    """Per core: seconds busy (not idle, not waiting for I/O) since boot."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for ln in Path("/proc/stat").read_text().splitlines():
        if re.match(r"cpu\d+ ", ln):
            f = [int(x) for x in ln.split()[1:]]
            out[int(ln.split()[0][3:])] = (sum(f[:8]) - f[3] - f[4]) / tick
    return out


# -- the job ------------------------------------------------------------------------------------------------
@dataclass
class Config:
    hidden: int
    batch: int


class Elastic:
    def __init__(self, base: Path, devices: Devices, poller: Poller, cfg: Config) -> None:
        self.base = base
        self.devices = devices
        self.poller = poller
        self.cfg = cfg
        self.server = RendezvousServer()
        self.store = CheckpointStore(str(base / "store"))
        self.node = NodeRoot("bench", base / "node")
        self.work = base / "work"
        self.work.mkdir()
        self.builds = 0
        self.job: Job | None = None
        self.d = 0

    def specs(self, d: int) -> tuple[list[RankSpec], str]:
        self.builds += 1
        prefix = f"{JOB_ID}/{self.builds}"
        argv = (sys.executable, str(SCRIPT), "--steps", str(10**9), "--hidden", str(self.cfg.hidden),
                "--batch", str(self.cfg.batch))
        on = rank_map(tuple(range(d)), WORLD)
        return [RankSpec(JOB_ID, r, argv, self.work, {
            **base_env(), "RANK": str(r), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TIDAL_STORE": self.server.addr, "TIDAL_STORE_PREFIX": prefix,
        }, tuple(self.devices.cpus[on[r]])) for r in range(WORLD)], prefix

    def _placed(self, specs: list[RankSpec], d: int) -> None:
        assert self.job is not None
        on = rank_map(tuple(range(d)), WORLD)
        for rp in self.job.ranks:
            self.devices.place(on[rp.spec.rank], rp.pid)
        self.poller.watch([self.node.log_path(s) for s in specs])
        self.d = d

    def launch(self, d: int) -> None:
        specs, _ = self.specs(d)
        self.job = Job.launch(JOB_ID, [(s, self.node) for s in specs], self.store)
        self._placed(specs, d)

    def resize(self, d: int, local: bool) -> dict[str, Any]:
        """``local``: restore from the images dumped here while the commit runs in the background, else from
        the store once committed."""
        assert self.job is not None
        before = self.d
        t0 = time.perf_counter()
        dump = self.job.checkpoint_local(keep=1) if local else None
        info = self.job.checkpoint(then="kill", keep=1) if dump is None else None
        t1 = time.perf_counter()
        ck = self.job.last_timing
        assert ck is not None
        cut_step = max(self.poller.step(r) for r in range(WORLD))
        last_seen = max(self.poller.when(r, self.poller.step(r)) for r in range(WORLD))
        specs, prefix = self.specs(d)
        self.job = Job.restore(self.store, JOB_ID, [(s, self.node) for s in specs],
                               rendezvous=Store(self.server.addr, prefix), local=dump)
        t2 = time.perf_counter()
        rt = self.job.restore_timing
        assert rt is not None
        self._placed(specs, d)
        wait_for(lambda: self.poller.all_past(cut_step), 120, "steps after the restore")
        resumed = max(self.poller.when(r, cut_step + 1) for r in range(WORLD))
        if dump is not None:  # committed in the background, after the ranks went on
            info = dump.wait()
        assert info is not None
        return {"from": before, "to": d, "restored_from": "local" if local else "store",
                "gap_s": resumed - last_seen, "request_to_resumed_s": resumed - t0,
                "checkpoint_s": t1 - t0, "restore_s": t2 - t1, "cut_step": cut_step,
                # checkpoint: cut + CRIU dump of the 4 ranks, working directory and logs, commit to the store
                # (before the ranks are killed); restore: fetch and verify, put files back, CRIU restore
                # (local: the commit ran in the background, off the pause)
                "cut_and_dump_s": ck.dump_s, "files_s": ck.fs_s, "commit_s": dump.commit_s if dump else ck.commit_s,
                "fetch_s": rt.fetch_s, "restore_files_s": rt.fs_s, "criu_restore_s": rt.criu_s,
                "image_bytes": info.logical_bytes, "stored_bytes": info.stored_bytes}

    def measure(self, warmup: float, window: float) -> dict[str, Any]:
        assert self.job is not None
        time.sleep(warmup)
        s0, c0, b0, l0 = self.poller.step(), job_cpu(self.job), core_busy(), os.getloadavg()[0]
        t0 = time.perf_counter()
        time.sleep(window)
        s1, c1, b1 = self.poller.step(), job_cpu(self.job), core_busy()
        elapsed = time.perf_counter() - t0
        steps = s1 - s0
        if steps < 2:
            raise BenchmarkError(f"only {steps} steps in a {window}s window on {self.d} device(s)",
                                 hint="give a longer --window, or a smaller model (--hidden, --batch)")
        rate = steps / (self.poller.when(0, s1) - self.poller.when(0, s0))
        cpu, wait = c1[0] - c0[0], c1[1] - c0[1]
        busy = sum(b1[c] - b0[c] for c in b1)
        capacity = self.d * self.devices.share * elapsed
        return {"devices": self.d, "steps": steps, "window_s": elapsed, "steps_per_s": rate,
                "cpu_s": cpu, "cpu_per_step_s": cpu / steps, "runqueue_wait_per_step_s": wait / steps,
                "context_switches_per_step": (c1[2] - c0[2]) / steps,
                "device_share_obtained": cpu / capacity,
                "machine_busy_cores": busy / elapsed, "other_cpu_cores": (busy - cpu) / elapsed,
                "load_average_1m": [l0, os.getloadavg()[0]]}

    def close(self) -> None:
        if self.job is not None:
            self.job.kill()
        self.server.close()


# -- the run ------------------------------------------------------------------------------------------------
def summarize(windows: list[dict[str, Any]], resizes: list[dict[str, Any]], share: float) -> dict[str, Any]:
    by: dict[int, dict[str, Any]] = {}
    for d in sorted({w["devices"] for w in windows}, reverse=True):
        ws = [w for w in windows if w["devices"] == d]
        wall = sum(w["steps"] / w["steps_per_s"] for w in ws)
        steps = sum(w["steps"] for w in ws)
        cpu = sum(w["cpu_s"] for w in ws)
        by[d] = {"windows": len(ws), "steps": steps, "steps_per_s": steps / wall,
                 "steps_per_s_each": [w["steps_per_s"] for w in ws], "step_s": wall / steps,
                 "cpu_per_step_s": cpu / steps,
                 "context_switches_per_step": sum(w["context_switches_per_step"] * w["steps"] for w in ws) / steps,
                 "device_share_obtained": cpu / sum(w["window_s"] * d * share for w in ws),
                 "other_cpu_cores": statistics.mean(w["other_cpu_cores"] for w in ws),
                 "machine_busy_cores": statistics.mean(w["machine_busy_cores"] for w in ws)}
    ref = by[WORLD]
    for d, b in by.items():
        b["efficiency_per_device"] = (b["steps_per_s"] / d) / (ref["steps_per_s"] / WORLD)
        b["efficiency_per_device_cpu"] = ref["cpu_per_step_s"] / b["cpu_per_step_s"]
    out: dict[str, Any] = {
        "throughput_by_devices": {str(d): b["steps_per_s"] for d, b in by.items()},
        "efficiency_per_device": {str(d): b["efficiency_per_device"] for d, b in by.items()},
        "efficiency_per_device_cpu": {str(d): b["efficiency_per_device_cpu"] for d, b in by.items()},
        "by_devices": {str(d): b for d, b in by.items()},
        "resize_pause_s": statistics.median(r["gap_s"] for r in resizes),
        "resize_pause_max_s": max(r["gap_s"] for r in resizes),
        "resize_pause_s_by_source": {src: statistics.median(r["gap_s"] for r in resizes if r["restored_from"] == src)
                                     for src in ("store", "local") if any(r["restored_from"] == src for r in resizes)},
        "resizes": resizes,
    }
    if 1 in by:
        one = by[1]
        out["timeslice_overhead_cpu"] = one["cpu_per_step_s"] / ref["cpu_per_step_s"] - 1
        out["timeslice_overhead_wall"] = one["step_s"] * share / ref["cpu_per_step_s"] - 1
        out["timeslice_overhead_vs_dedicated"] = ref["steps_per_s"] / (WORLD * one["steps_per_s"]) - 1
        out["paper_timeslice_overhead"] = [0.014, 0.056]
    return out


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench-elastic")
    p.add_argument("--sequence", default="4,2,1,4,1,2,4", help="devices of each window, in order (starts with 4)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after a resize before a window")
    p.add_argument("--window", type=float, default=12.0, help="seconds of each throughput window")
    p.add_argument("--hidden", type=int, default=512, help="the model's hidden width (ddp_train.py)")
    p.add_argument("--batch", type=int, default=64, help="each rank's batch (ddp_train.py)")
    p.add_argument("--restore-from", choices=("store", "local", "both"), default="local",
                   help="where a resize restores from: the images dumped on this node while the commit runs in "
                        "the background (local), the store once committed (store), or each in turn, the first "
                        "resize from the store (both: the two compared in one run)")
    args = p.parse_args()
    seq = [int(d) for d in args.sequence.split(",")]
    if seq[0] != WORLD or any(not 1 <= d <= WORLD for d in seq) or any(a == b for a, b in itertools.pairwise(seq)):
        print(f"error: the sequence starts with {WORLD}, stays within 1..{WORLD} and changes at every step",
              file=sys.stderr)
        return 1
    host_ranks()
    devices = Devices()
    poller = Poller()
    poller.thread.start()
    out: dict[str, Any] = {"machine": {**machine(with_torch=True), "cores": len(devices.cores)},
                           "devices": devices.describe(), "world_size": WORLD,
                           "workload": {"script": "examples/ddp_train.py", "hidden": args.hidden,
                                        "batch": args.batch},
                           "sequence": seq, "warmup_s": args.warmup, "window_s": args.window,
                           "restore_from": args.restore_from}
    windows: list[dict[str, Any]] = []
    resizes: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        with workspace(args.dir) as base:
            el = Elastic(base, devices, poller, Config(args.hidden, args.batch))
            try:
                say(f"launching W = {WORLD} on {seq[0]} devices")
                el.launch(seq[0])
                wait_for(lambda: poller.all_past(2), 300, "the first steps")
                for i, d in enumerate(seq):
                    if i:
                        say(f"resize {el.d} → {d}")
                        local = args.restore_from == "local" or (args.restore_from == "both" and i % 2 == 0)
                        resizes.append(el.resize(d, local))
                        say(f"  gap {resizes[-1]['gap_s']:.2f} s")
                    say(f"window {i + 1} of {len(seq)}: {d} device(s)")
                    windows.append(el.measure(args.warmup, args.window))
                    if i:
                        resizes[-1]["step_s_after"] = 1 / windows[-1]["steps_per_s"]
                    say(f"  {windows[-1]['steps_per_s']:.2f} steps/s, device share obtained "
                        f"{windows[-1]['device_share_obtained']:.2f}")
            finally:
                el.close()
    finally:
        poller.stop.set()
        devices.close()
    out["windows"] = windows
    out |= summarize(windows, resizes, devices.share)
    out["machine"]["load_average_at_end"] = os.getloadavg()
    out["duration_s"] = time.perf_counter() - t_start
    out["other_cpu_cores_mean"] = statistics.mean(w["other_cpu_cores"] for w in windows)

    m, dv = out["machine"], out["devices"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, kernel {m['kernel']}, CRIU {m['criu']}, torch {m['torch']}; "
          f"load average {m['load_average_at_start'][0]:.2f} at start, {m['load_average_at_end'][0]:.2f} at end; "
          f"other processes used {out['other_cpu_cores_mean']:.2f} of {m['cores']} cores during the windows")
    print(f"devices: {NODE_DEVICES} per node on {m['cores']} cores: device i on core(s) {dv['device_cpus']}, "
          f"{dv['device_share_cpu']:.2f} CPU each" + (" (CFS quota)" if dv["cpu_quota"] else "")
          + f"; W = {WORLD}, rank r on device r*D//{WORLD}; ddp_train.py --hidden {args.hidden} --batch {args.batch}")
    print(f"{'D':>2} {'windows':>7} {'steps/s':>8} {'per device':>10} {'eff/device':>10} {'CPU ms/step':>11} "
          f"{'eff (CPU)':>9} {'switches/step':>13} {'share got':>9} {'others':>7} {'busy':>5}")
    for d, b in out["by_devices"].items():
        print(f"{d:>2} {b['windows']:>7} {b['steps_per_s']:>8.2f} {b['steps_per_s'] / int(d):>10.2f} "
              f"{b['efficiency_per_device']:>10.3f} {b['cpu_per_step_s'] * 1e3:>11.2f} "
              f"{b['efficiency_per_device_cpu']:>9.3f} {b['context_switches_per_step']:>13.0f} "
              f"{b['device_share_obtained']:>9.2f} "
              f"{b['other_cpu_cores']:>7.2f} {b['machine_busy_cores']:>5.2f}")
    print("  eff/device: (steps/s ÷ D) against the 4-device run; eff (CPU): CPU ms/step on 4 against on D; "
          "share got: the job's CPU over its devices' capacity; others, busy: cores used by other processes, "
          "by all")
    print(f"{'resize':>7} {'from':>5} {'gap s':>7} {'checkpoint s':>12} {'cut+dump':>8} {'commit':>7} "
          f"{'restore s':>10} "
          f"{'fetch':>6} {'criu':>6} {'request→resumed s':>18} {'step s after':>12} {'image MB':>9} {'stored MB':>9}")
    for r in resizes:
        print(f"{r['from']:>3}→{r['to']:<3} {r['restored_from']:>5} {r['gap_s']:>7.2f} {r['checkpoint_s']:>12.2f} "
              f"{r['cut_and_dump_s']:>8.2f} "
              f"{r['commit_s']:>7.2f} {r['restore_s']:>10.2f} {r['fetch_s']:>6.2f} {r['criu_restore_s']:>6.2f} "
              f"{r['request_to_resumed_s']:>18.2f} {r['step_s_after']:>12.3f} {r['image_bytes'] / 1e6:>9.0f} "
              f"{r['stored_bytes'] / 1e6:>9.1f}")
    print(f"resize_pause_s {out['resize_pause_s']:.2f} (median of {len(resizes)}; max {out['resize_pause_max_s']:.2f})")
    by_source = out["resize_pause_s_by_source"]
    for src, pause in by_source.items():
        n = sum(r["restored_from"] == src for r in resizes)
        print(f"  restored from {src}: median pause {pause:.2f} s ({n} resizes)")
    if len(by_source) == 2:
        print(f"  local / store: {by_source['local'] / by_source['store']:.2f}")
    if "timeslice_overhead_cpu" in out:
        print(f"time-slicing 4 ranks on 1 device against their work one after another: "
              f"{out['timeslice_overhead_cpu'] * 100:+.1f} % CPU work, "
              f"{out['timeslice_overhead_wall'] * 100:+.1f} % device time (includes other load), "
              f"{out['timeslice_overhead_vs_dedicated'] * 100:+.1f} % against 4 dedicated devices; "
              f"paper: +1.4 … +5.6 % (4 ranks on 1 GPU)")
    print(f"run took {out['duration_s']:.0f} s")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
