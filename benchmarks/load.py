#!/usr/bin/env python3
"""Load benchmark: a real control plane on PostgreSQL under N users submitting, listing and cancelling, and K
simulated agents (processes speaking the real agent protocol, acknowledging what they are told to run, with
nothing behind it), for a set time.

Reported: submissions/s, p50/p99 latency per route, the agents'
heartbeat p99 against their lease (and the agent's own request timeout, a quarter of it), the scheduler's
decisions (jobs placed per second, and how long after its submission each job was placed or told why it
waits: p50/p99/max against the 2 s target), lease losses (none is spurious here: every simulated agent keeps
heartbeating), 5xx answers, and the control plane's memory and CPU.

    python benchmarks/load.py [--json FILE] [--seconds 60] [--users 8] [--agents 200] [--devices 8]
                              [--database postgresql|sqlite] [--user-processes 2] [--agent-processes 4]

Users' rate and queue limits are lifted for the run (an admin's override per user: the figure is the control
plane's, not a user's limit). Everything runs on this machine, clients and agents included: on a small machine
they take a good part of its CPU. Run as root (PostgreSQL runs as its own account). Timings are never asserted
in tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from harness import BenchmarkError, arguments, run, say, wait_for, write_json
from tidal.config import Settings
from tidal.control.bootstrap import bootstrap
from tidal.control.clusterfile import token_path
from tidal.control.store.db import Database
from tidal.testing.load import percentile
from tidal.testing.postgres import PostgresServer

TARGET_DECIDED_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


def _decisions(db: Database, t0: float, t1: float) -> dict[str, Any]:
    """From the event log: how long after its submission each job was first placed or told why it waits, and
    how many were placed in [t0, t1]."""
    q = text("""select j.id, j.submitted_at,
                       min(case when e.kind in ('running', 'waiting') then e.time end) as decided,
                       min(case when e.kind = 'running' then e.time end) as placed
                from jobs j left join events e on e.job_id = j.id
                where j.submitted_at between :t0 and :t1 group by j.id, j.submitted_at""")
    with db.engine.connect() as conn:
        rows = conn.execute(q, {"t0": t0, "t1": t1}).all()
        lost = conn.execute(text("select count(*) from events where kind = 'node_down' and time between :t0 and :t1"),
                            {"t0": t0, "t1": t1}).scalar_one()
    lags = sorted(r.decided - r.submitted_at for r in rows if r.decided is not None)
    placed = sum(1 for r in rows if r.placed is not None and r.placed <= t1)
    undecided = sum(1 for r in rows if r.decided is None)
    return {"jobs": len(rows), "placed": placed, "placed_per_s": placed / (t1 - t0), "undecided": undecided,
            "decided_p50_s": percentile(lags, 0.5), "decided_p99_s": percentile(lags, 0.99),
            "decided_max_s": lags[-1] if lags else None, "lease_losses": int(lost)}


def main() -> int:
    ap = arguments(__doc__, "/tmp/tidal-bench-load")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--devices", type=int, default=8, help="devices per simulated agent")
    ap.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    ap.add_argument("--user-processes", type=int, default=2)
    ap.add_argument("--agent-processes", type=int, default=4)
    args = ap.parse_args()
    if os.geteuid() != 0 and args.database == "postgresql":
        raise BenchmarkError("PostgreSQL runs here as its own account: run the benchmark as root")
    home = Path(tempfile.mkdtemp(prefix="tidal-load-"))
    pg = PostgresServer() if args.database == "postgresql" else None
    procs: list[subprocess.Popen[str]] = []
    try:
        url = pg.create_database("tidal") if pg else f"sqlite:///{home / 'tidal.db'}"
        settings = Settings(home=home, database_url=url)
        bootstrap(settings)
        port = _free_port()
        api = f"http://127.0.0.1:{port}"
        env = {**os.environ, "TIDAL_HOME": str(home), "TIDAL_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
        log = open(home / "control.log", "wb")  # noqa: SIM115 (open for the server's life)
        server = subprocess.Popen([sys.executable, "-m", "tidal.control.server", "--port", str(port)], env=env,
                                  stdout=log, stderr=log, text=True)
        procs.append(server)
        wait_for(lambda: _healthy(api), 60, "the control plane")
        admin = httpx.Client(base_url=api, timeout=60,
                             headers={"Authorization": f"Bearer {token_path(home, 'admin').read_text().strip()}"})
        user_files = []
        for i in range(args.users):
            r = admin.post("/v1/users", json={"name": f"u{i}", "role": "user"})
            r.raise_for_status()
            admin.patch(f"/v1/users/u{i}/limits", json={"rate": "unlimited", "max_queued": "unlimited"}
                        ).raise_for_status()
            f = home / f"u{i}.token"
            f.write_text(r.json()["token"])
            user_files.append(str(f))
        cluster = str(token_path(home, "cluster"))
        names = [f"sim-{i:03d}" for i in range(args.agents)]
        say(f"{args.agents} simulated agents × {args.devices} devices, {args.users} users, {args.seconds:g}s, "
            f"{args.database}")
        agent_procs = [subprocess.Popen([sys.executable, "-m", "tidal.testing.load", "agents", "--url", api,
                                         "--token-file", cluster, "--names", ",".join(group), "--devices",
                                         str(args.devices), "--seconds", str(args.seconds + 10)],
                                        env=env, stdout=subprocess.PIPE, text=True)
                       for group in _split(names, args.agent_processes)]
        procs += agent_procs
        wait_for(lambda: _nodes_up(admin, len(names)), 120, "the simulated agents to register")
        cpu0, t0 = _cpu_s(server.pid), time.time()
        body = {"command": ["true"], "workdir": str(home), "tier": "basic", "env": {}}
        user_procs = [subprocess.Popen([sys.executable, "-m", "tidal.testing.load", "users", "--url", api,
                                        "--token-files", ",".join(group), "--body", json.dumps(body),
                                        "--seconds", str(args.seconds)], env=env, stdout=subprocess.PIPE, text=True)
                      for group in _split(user_files, args.user_processes)]
        procs += user_procs
        tallies = [json.loads(p.communicate(timeout=args.seconds + 120)[0]) for p in user_procs]
        t1, cpu1 = time.time(), _cpu_s(server.pid)
        memory = _memory(server.pid)
        beats = [json.loads(p.communicate(timeout=args.seconds + 120)[0]) for p in agent_procs]
        time.sleep(TARGET_DECIDED_S)  # let the last submissions be decided
        db = Database(url)
        decided = _decisions(db, t0, t1)
        db.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if pg:
            pg.stop()
    routes: dict[str, dict[str, Any]] = {}
    for t in tallies:
        for route, r in t["routes"].items():
            routes.setdefault(route, {"requests": 0, "statuses": {}})
            routes[route]["requests"] += r["requests"]
            for k, v in r["statuses"].items():
                routes[route]["statuses"][k] = routes[route]["statuses"].get(k, 0) + v
            routes[route].setdefault("p50_s", []).append(r["p50_s"])
            routes[route].setdefault("p99_s", []).append(r["p99_s"])
    seconds = t1 - t0
    submitted = routes.get("submit", {}).get("statuses", {}).get("201", 0)
    fivexx = sum(v for r in routes.values() for k, v in r["statuses"].items() if k.startswith("5"))
    hb_p99 = max((b["p99_s"] for b in beats if b["p99_s"] is not None), default=None)
    out = {"machine": _machine(), "args": vars(args) | {"json": str(args.json), "dir": str(args.dir)},
           "seconds": seconds, "submissions": submitted, "submissions_per_s": submitted / seconds,
           "routes": {k: {"requests": v["requests"], "p50_s": max(x for x in v["p50_s"] if x is not None),
                          "p99_s": max(x for x in v["p99_s"] if x is not None), "statuses": v["statuses"]}
                      for k, v in routes.items()},
           "heartbeats": {"count": sum(b["heartbeats"] for b in beats), "p99_s": hb_p99,
                          "max_s": max((b["max_s"] for b in beats if b["max_s"] is not None), default=None),
                          "late": sum(b["late"] for b in beats), "refused": sum(b["refused"] for b in beats),
                          "lease_s": beats[0]["lease_s"] if beats else None},
           "decisions": decided, "http_5xx": fivexx,
           "control_plane": {"cpu_s": cpu1 - cpu0, "cpu_ms_per_request":
                             1000 * (cpu1 - cpu0) / max(1, sum(v["requests"] for v in routes.values())),
                             "rss_bytes": memory.get("VmRSS"), "peak_rss_bytes": memory.get("VmHWM")}}
    _print(out)
    write_json(args.json, out)
    return 0


def _machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "")
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average_at_end": os.getloadavg()}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _nodes_up(admin: httpx.Client, n: int) -> bool:
    return sum(1 for node in admin.get("/v1/nodes").json() if node["up"]) >= n


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f} ms"


def _print(out: dict[str, Any]) -> None:
    m = out["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores; load average at the end {m['load_average_at_end']}")
    print(f"submissions: {out['submissions']} in {out['seconds']:.1f}s = {out['submissions_per_s']:.0f}/s (each "
          f"user's client waits for its answer before it sends the next; benchmarks/crosshost.py measures the rate)")
    print("| route | requests | p50 | p99 | statuses |")
    print("|---|---:|---:|---:|---|")
    for route, r in sorted(out["routes"].items()):
        print(f"| {route} | {r['requests']} | {_ms(r['p50_s'])} | {_ms(r['p99_s'])} | {r['statuses']} |")
    hb = out["heartbeats"]
    print(f"heartbeats: {hb['count']}, p99 {_ms(hb['p99_s'])}, max {_ms(hb['max_s'])} against a lease of "
          f"{hb['lease_s']}s (request timeout {hb['lease_s'] / 4 if hb['lease_s'] else '-'}s); late {hb['late']}, "
          f"refused {hb['refused']}")
    d = out["decisions"]
    print(f"decisions: {d['placed']} placed ({d['placed_per_s']:.1f}/s); decided after submission p50 "
          f"{_ms(d['decided_p50_s'])}, p99 {_ms(d['decided_p99_s'])}, max {_ms(d['decided_max_s'])} "
          f"(target {TARGET_DECIDED_S:g}s), undecided {d['undecided']}; lease losses {d['lease_losses']}")
    cp = out["control_plane"]
    print(f"5xx: {out['http_5xx']}; control plane: {cp['cpu_s']:.1f} CPU s ({cp['cpu_ms_per_request']:.2f} ms a "
          f"user request, agents' included), RSS {cp['rss_bytes'] / 2**20:.0f} MiB (peak "
          f"{cp['peak_rss_bytes'] / 2**20:.0f} MiB)")


if __name__ == "__main__":
    run(main)
