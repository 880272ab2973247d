"""Live-cluster API benchmark: submissions per second, how long a single-rank job of about 250 MB takes from a
preempt (then resume) or a migrate request to running again, and how long a premium job takes from its
submission to running, onto a free device and onto one a basic job of about 250 MB holds (the scheduler
preempts it first), end to end through the API on a local 2-node cluster with real CRIU.

    python benchmarks/api.py [--json FILE] [--submissions N] [--mb 250] [--repeat 3]

Prints the figures and writes them as JSON. Timings are never asserted in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import HOLDER, run, wait_for, write_json
from tidal.config import Settings
from tidal.control.client import Client
from tidal.control.clusterfile import token_path
from tidal.control.localcluster import down, up
from tidal.errors import Conflict


def _wait(api: Client, job: str, cond: Any, timeout: float = 120.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        j: dict[str, Any] = api.get(f"/v1/jobs/{job}")
        return j if cond(j) else None

    return wait_for(check, timeout, f"job {job}", interval=0.005)


def _running(j: dict[str, Any]) -> bool:
    return j["state"] == "running" and not j["busy"] and all(p["pid"] for p in j["placement"])


def submissions(api: Client, workdir: Path, n: int, threads: int) -> float:
    body = {"command": ["true"], "workdir": str(workdir), "tier": "basic", "env": {}}
    ids: list[str] = []

    def one(_: int) -> None:
        ids.append(api.post("/v1/jobs", json=body)["id"])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))
    dt = time.perf_counter() - t0
    for job in ids:  # leave the cluster empty for the latency runs
        with contextlib.suppress(Conflict):  # it has already finished
            api.post(f"/v1/jobs/{job}/cancel")
    return n / dt


def latencies(api: Client, workdir: Path, mb: int, repeat: int) -> dict[str, Any]:
    job = api.post("/v1/jobs", json={"command": [sys.executable, "-c", HOLDER.format(mb=mb)],
                                     "workdir": str(workdir), "env": {}})["id"]
    _wait(api, job, _running)
    time.sleep(3)  # let it fill its memory
    preempt, migrate, image = [], [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        api.post(f"/v1/jobs/{job}/preempt")
        _wait(api, job, lambda j: j["state"] == "preempted" and not j["busy"])
        api.post(f"/v1/jobs/{job}/resume")
        _wait(api, job, _running)
        preempt.append(time.perf_counter() - t0)
        node = _wait(api, job, _running)["placement"][0]["node"]
        t0 = time.perf_counter()
        api.post(f"/v1/jobs/{job}/migrate", json={})
        j = _wait(api, job, lambda j, node=node: _running(j) and j["placement"][0]["node"] != node)
        migrate.append(time.perf_counter() - t0)
        image = j["checkpoints"][-1]["bytes"]
    api.post(f"/v1/jobs/{job}/cancel")
    return {"preempt_to_running_s": statistics.median(preempt), "preempt_to_running_all_s": preempt,
            "migrate_to_running_s": statistics.median(migrate), "migrate_to_running_all_s": migrate,
            "image_bytes": image}


def premium_latencies(api: Client, workdir: Path, mb: int, repeat: int) -> dict[str, Any]:
    """From a premium job's submission to it running (its rank's pid known): onto a free device, and onto a
    device held by a basic job of ``mb`` MiB (which the scheduler preempts: checkpointed, then stopped)."""
    small = {"command": [sys.executable, "-c", HOLDER.format(mb=1)], "workdir": str(workdir), "env": {},
             "tier": "premium"}
    free, preempting = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        job = api.post("/v1/jobs", json=small)["id"]
        _wait(api, job, _running)
        free.append(time.perf_counter() - t0)
        api.post(f"/v1/jobs/{job}/cancel")
        _wait(api, job, lambda j: j["state"] == "cancelled")
    # Every device busy with a basic job of ``mb`` MiB; then a premium job arrives.
    basics = [api.post("/v1/jobs", json={"command": [sys.executable, "-c", HOLDER.format(mb=mb)],
                                         "workdir": str(workdir), "env": {}, "tier": "basic"})["id"]
              for _ in range(2)]
    for b in basics:
        _wait(api, b, _running)
    time.sleep(3)  # let them fill their memory
    for _ in range(repeat):
        t0 = time.perf_counter()
        job = api.post("/v1/jobs", json=small)["id"]
        _wait(api, job, _running)
        preempting.append(time.perf_counter() - t0)
        api.post(f"/v1/jobs/{job}/cancel")
        _wait(api, job, lambda j: j["state"] == "cancelled")
        for b in basics:  # the preempted one resumes on the device given back
            _wait(api, b, _running)
        time.sleep(1)
    for b in basics:
        api.post(f"/v1/jobs/{b}/cancel")
    return {"premium_free_s": statistics.median(free), "premium_free_all_s": free,
            "premium_preempting_s": statistics.median(preempting), "premium_preempting_all_s": preempting}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--submissions", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--mb", type=int, default=250)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--database-url", default=None, help="e.g. postgresql+psycopg://...; default SQLite")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as tmp:
        home = Path(tmp) / "home"
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        settings = Settings(home=home, database_url=args.database_url)
        st, _ = up(settings, nodes=2, devices_per_node=1)
        try:
            token = token_path(home, "user").read_text().strip()
            with contextlib.closing(Client(st.url, token)) as api:
                db = "postgresql" if (args.database_url or "").startswith("postgres") else "sqlite"
                out: dict[str, Any] = {"database": db, "submissions": args.submissions,
                                       "threads": args.threads}
                out["submissions_per_s"] = submissions(api, workdir, args.submissions, args.threads)
                out.update(latencies(api, workdir, args.mb, args.repeat))
                out.update(premium_latencies(api, workdir, args.mb, args.repeat))
                out["job_mb"] = args.mb
        finally:
            down(settings)
    for k, v in out.items():
        print(f"{k:28s} {v if not isinstance(v, float) else round(v, 3)}")
    write_json(args.json, out)


if __name__ == "__main__":
    run(main)
