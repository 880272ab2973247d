#!/usr/bin/env python3
"""GPU checkpoint benchmark: the pause and restore of a CUDA process holding 1, 8 and 40 GB of GPU memory,
against plain CRIU of a process holding the same bytes in host memory, in one run.

For each size a rank (a Python process that fills that much GPU memory with random data, then waits) is
checkpointed the way a Tidal checkpoint does it, step by step: the device-state step (lock, then the
driver's checkpoint: device memory to host memory), freeze, ``criu dump`` to the node's staging area;
then killed, ``criu restore``-d from those images and its GPU state restored (host memory to the GPU) and
unlocked. The pause is lock + device-to-host + dump; the restore is ``criu restore`` + host-to-device. The
baseline (same run) is plain CRIU of a CPU process holding the same number of bytes in host memory:
freeze + dump, restore. Each restored process checks its data (a checksum taken before the checkpoint),
so a figure is only reported for a round trip that kept every byte. The checkpoint store's commit (hashing,
compression, upload) is the same for both and not part of these figures (see benchmarks/checkpoint.py).

Needs root, CRIU (``make criu``), an NVIDIA GPU with driver ≥ 570 and torch with CUDA in this Python.
Prints a table and writes JSON (``--json FILE``).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from harness import arguments, base_env, host_ranks, machine, run, say, wait_for, workspace, write_json
from tidal.mechanisms.criu.provision import find_criu
from tidal.mechanisms.criu.rank import NodeRoot, RankProcess, RankSpec
from tidal.mechanisms.criu.runner import CriuRunner
from tidal.mechanisms.gpu.devicestate import DeviceState

GB = 1 << 30
# Fills SIZE bytes (on DEVICE: cuda or cpu) with random data, prints its checksum, then waits; once the
# file "verify" exists in its working directory, prints the checksum again and exits.
HOLDER = r"""
import os, sys, time, torch
size, device = int(sys.argv[1]), sys.argv[2]
n = max(1, size // 4)
# One allocation of SIZE bytes, filled block by block with 256 MiB of random data (no second copy: 40 GB must
# fit on an 80 GB GPU), and summed block by block in double precision.
x = torch.empty(n, device=device)
block = torch.rand(min(n, 1 << 26), device=device)
for i in range(0, n, block.numel()):
    x[i:i + block.numel()] = block[:n - i]
del block
def checksum():
    return sum(x[i:i + (1 << 26)].double().sum().item() for i in range(0, n, 1 << 26))
print("sum", checksum(), flush=True)
while not os.path.exists("verify"):
    time.sleep(0.02)
print("sum", checksum(), flush=True)
"""


def one(root: Path, name: str, size: int, device: str, runner: CriuRunner, step: DeviceState) -> dict[str, Any]:
    work = root / name
    work.mkdir()
    node = NodeRoot(f"bench-{name}", root / f"node-{name}")
    spec = RankSpec("bench", 0, (sys.executable, "-c", HOLDER, str(size), device), work,
                    {**base_env(), "CUDA_VISIBLE_DEVICES": "0"})
    rank = RankProcess.launch(spec, node)
    log = node.log_path(spec)
    try:
        wait_for(lambda: log.read_text().count("sum ") >= 1 or None, 600, f"the {name} holder to fill its memory")
        t0 = time.perf_counter()
        suspended = step.suspend(spec.name, rank.pids())
        t_dev = time.perf_counter()
        rank.freeze()
        staging = node.staging(f"bench-{name}", size + GB)
        dump = rank.dump(staging / "rank-0", runner, ghost_limit=256 << 20)
        t_dump = time.perf_counter()
        rank.kill()
        image = sum(f.stat().st_size for f in dump.images.iterdir())
        t1 = time.perf_counter()
        rank = RankProcess.restore(spec, node, dump, runner, lazy=False)
        t_restore = time.perf_counter()
        resumed = step.resume(spec.name, rank.pids()) if suspended else []
        t_back = time.perf_counter()
        (work / "verify").touch()
        status = rank.wait(600)
        sums = [ln for ln in log.read_text().splitlines() if ln.startswith("sum ")]
        if status.code != 0 or len(sums) != 2 or sums[0] != sums[1]:
            raise SystemExit(f"{name}: the restored process lost data or failed ({status}, {sums})")
        return {"case": name, "device": device, "bytes": size, "image_bytes": image,
                "images_in": "memory" if str(staging).startswith("/dev/shm") else "disk",
                "cuda_processes": len(suspended), "resumed": len(resumed),
                "device_to_host_s": t_dev - t0, "dump_s": t_dump - t_dev, "pause_s": t_dump - t0,
                "criu_restore_s": t_restore - t1, "host_to_device_s": t_back - t_restore,
                "restore_s": t_back - t1}
    finally:
        rank.kill()
        node.clear_staging()


def room(root: Path, size: int) -> str | None:
    """Why a case of ``size`` bytes cannot run here (its images on disk, its bytes in host memory), or None."""
    # Images go to /dev/shm where it has room (NodeRoot.staging), else to the work directory's disk.
    free = max(shutil.disk_usage(root).free, shutil.disk_usage("/dev/shm").free)
    if free < size + 2 * GB:
        return f"needs {(size + 2 * GB) / GB:.0f} GB free for its images (memory or disk), {free / GB:.1f} GB is"
    avail = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
                 if ln.startswith("MemAvailable:"))
    if avail < size + 4 * GB:
        return f"needs {(size + 4 * GB) / GB:.0f} GB of host memory, {avail / GB:.1f} GB is available"
    return None


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench-gpu")
    p.add_argument("--sizes", default="1,8,40", help="GPU memory per case, in GB (comma-separated)")
    p.add_argument("--no-baseline", action="store_true", help="skip plain CRIU of host memory")
    p.add_argument("--cpu-only", action="store_true",
                   help="only the baseline (plain CRIU of host memory): checks the benchmark where there is no GPU")
    args = p.parse_args()
    host_ranks()
    find_criu()
    runner = CriuRunner()
    step = DeviceState()
    sizes = [float(s) for s in args.sizes.split(",")]
    devices = ("cpu",) if args.cpu_only else ("cuda",) + (() if args.no_baseline else ("cpu",))
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    out: dict[str, Any] = {"machine": machine(with_torch=True),
                           "gpus": [] if args.cpu_only else step.driver.uuids(), "results": results,
                           "skipped": skipped}
    with workspace(args.dir) as root:
        for gb in sizes:
            for device in devices:
                name = f"{device}-{gb:g}GB"
                why = room(root, int(gb * GB))
                if why:
                    say(f"{name}: skipped: {why}")
                    skipped.append({"case": name, "why": why})
                    continue
                say(f"{name}: fill, checkpoint, restore")
                results.append(one(root, name, int(gb * GB), device, runner, step))
                r = results[-1]
                say(f"{name}: pause {r['pause_s']:.2f} s (device to host {r['device_to_host_s']:.2f} s, dump "
                    f"{r['dump_s']:.2f} s), restore {r['restore_s']:.2f} s (host to device "
                    f"{r['host_to_device_s']:.2f} s)")
                write_json(args.json, out)
    print(f"{'case':<12} {'GiB':>6} {'d2h s':>7} {'dump s':>7} {'pause s':>8} {'restore s':>9} {'h2d s':>7} "
          f"{'d2h GB/s':>9} {'pause ×plain':>12}")
    plain = {r["bytes"]: r for r in results if r["device"] == "cpu"}
    for r in results:
        rate = r["bytes"] / r["device_to_host_s"] / 1e9 if r["device"] == "cuda" and r["device_to_host_s"] else 0
        base = plain.get(r["bytes"])
        ratio = r["pause_s"] / base["pause_s"] if base and r["device"] == "cuda" else None
        r["pause_vs_plain"] = ratio
        print(f"{r['case']:<12} {r['bytes'] / GB:>6.1f} {r['device_to_host_s']:>7.2f} {r['dump_s']:>7.2f} "
              f"{r['pause_s']:>8.2f} {r['restore_s']:>9.2f} {r['host_to_device_s']:>7.2f} "
              f"{rate:>9.1f} {ratio if ratio is not None else float('nan'):>12.2f}")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
