#!/usr/bin/env python3
"""Cross-host benchmark on test hosts: a migration between two hosts through SeaweedFS, against plain CRIU
with the images copied over the network; and submissions per second through the API from another host,
with the control plane on PostgreSQL.

The deployment is :class:`tidal.testing.hostcluster.HostCluster` on a :class:`tidal.testing.hosts.TestNet`:
PostgreSQL on host db, SeaweedFS on s3, ``tidal server --tls auto`` on cp, joined agents on n1 and n2, and a
host "client" for the load generator. Every host is a network namespace of this machine: what crosses
between them goes through veth pairs and a bridge (no bandwidth cap), on the same cores.

Migration: a single-rank job holding ``--mb`` MiB of random (incompressible) bytes, printing a step line
every 50 ms, runs on n1; ``POST /v1/jobs/ID/migrate {"to": "n2"}`` (what ``tidal migrate ID --to n2``
sends). Measured from the request: (a) the job running on n2 (state running, its rank's pid known), and (b)
the first step line the rank prints on n2 after its restore. The first migration finds the store empty
for the job (it uploads the whole image); a second one, back to n1 a few seconds later, finds the
previous checkpoint there (it uploads what changed; the target pre-stages that previous checkpoint while
the job is checkpointed, and its restore fetches only what changed). Baseline,
same run: plain CRIU on the same kind of process, started on n1: ``criu dump`` on n1 into /dev/shm, the
images sent over TCP from n1 to n2 (a socket on each host; the bytes cross the bridge), ``criu restore``
on n2; (a) when the restore returns, (b) the first step line after it.

Submissions: ``--clients`` processes on host "client", each with its own keep-alive HTTPS connection,
post ``--submissions`` jobs in all, as fast as they are answered. A job that sleeps holds each node's one
device, so the submitted jobs (one rank each) wait: what is measured is the API's acceptance. Reported: the
rate, p50/p99 latency, and CPU seconds per submission of the control plane (the server process) and of
PostgreSQL (every process on host db). Baseline, same run: the same load generator on the server's own
host (no bridge). Two rounds, alternating between the two hosts, the better of each; the jobs of each run
are cancelled before the next.

    python benchmarks/crosshost.py [--json FILE] [--mb 1280] [--submissions 2000] [--quick]

Run as root with CRIU provisioned (``make criu``). Prints the tables and writes JSON. Timings are never
asserted in tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import HOLDER, BenchmarkError, arguments, host_ranks, machine, run, say, wait_for, write_json
from tidal.mechanisms.criu.provision import find_criu
from tidal.testing.hostcluster import SERVER_PORT, HostCluster
from tidal.testing.hosts import Host, TestNet
from tidal.testing.relay import Relay

MB = 1 << 20
STEP = re.compile(rb"^step (\d+) ", re.M)

# The load generator, run on a host: CLIENTS processes, each with its own HTTPS connection, post N jobs in
# all once every one is connected. Prints JSON: when each request started and how long it took.
LOADGEN = r"""
import http.client, json, multiprocessing as mp, os, resource, ssl, sys, time
cfg = json.loads(sys.argv[1])
body = json.dumps(cfg["body"]).encode()
headers = {"Authorization": "Bearer " + cfg["token"], "Content-Type": "application/json"}

def client(k, n, barrier, out):
    ctx = ssl.create_default_context(cafile=cfg["ca"])
    conn = http.client.HTTPSConnection(cfg["addr"], cfg["port"], context=ctx, timeout=60)
    conn.request("GET", "/healthz"); conn.getresponse().read()
    barrier.wait()
    lat, bad = [], []
    t_start = time.monotonic()
    for _ in range(n):
        t = time.monotonic()
        conn.request("POST", "/v1/jobs", body=body, headers=headers)
        r = conn.getresponse(); data = r.read()
        lat.append(time.monotonic() - t)
        if r.status != 201:
            bad.append((r.status, data[:200].decode(errors="replace")))
    t_end = time.monotonic()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out.put({"lat": lat, "bad": bad[:5], "n_bad": len(bad), "start": t_start, "end": t_end,
             "cpu": ru.ru_utime + ru.ru_stime})

n, k = cfg["n"], cfg["clients"]
barrier, out = mp.Barrier(k), mp.Queue()
procs = [mp.Process(target=client, args=(i, n // k + (i < n % k), barrier, out)) for i in range(k)]
for p in procs: p.start()
res = [out.get() for _ in procs]
for p in procs: p.join()
print(json.dumps(res))
"""


# -- plain CRIU across hosts -----------------------------------------------------------------------------


def criu_on(host: Host, *args: str, images: Path, log: str) -> None:
    p = host.run([*find_criu().argv, *args, "-D", str(images), "-o", log], check=False, timeout=600)
    if p.returncode != 0:
        errors = [ln for ln in (images / log).read_text(errors="replace").splitlines() if "Error" in ln]
        raise BenchmarkError(f"criu {args[0]} on {host.name} failed: {errors[-3:]} (see {images / log})")


def send_dir(src: Host, dst: Host, source: Path, target: Path, delay: float = 0.0) -> int:
    """Copy the files of ``source`` (on ``src``) into ``target`` (on ``dst``) over one TCP connection from
    ``src``'s namespace to ``dst``'s: a receiver thread listens on ``dst``, the sender connects from ``src``
    and sends each file's name and size, then the file (sendfile). ``delay``: through a relay on ``dst`` that
    delays each way by that many seconds. The bytes sent."""
    target.mkdir(parents=True)
    lsock = dst.listen()
    port = lsock.getsockname()[1]
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            conn, _ = lsock.accept()
            with conn, conn.makefile("rb") as r:
                buf = bytearray(4 * MB)
                view = memoryview(buf)
                while True:
                    head = r.read(12)
                    if not head:
                        return
                    name_len, size = struct.unpack("!IQ", head)
                    name = r.read(name_len).decode()
                    with open(target / name, "wb") as f:
                        left = size
                        while left:
                            got = r.readinto(view[: min(left, len(buf))])
                            if not got:
                                raise BenchmarkError(f"the sender hung up in {name}")
                            f.write(view[:got])
                            left -= got
        except BaseException as exc:  # reported by the sender's side
            errors.append(exc)
        finally:
            lsock.close()

    rx = threading.Thread(target=receive)
    rx.start()
    sent = 0
    relay = Relay((dst.addr, port), delay, host=dst) if delay > 0 else None
    addr, port = (relay.addr, relay.port) if relay is not None else (dst.addr, port)
    try:
        with src.connect(addr, port) as s:
            for f in sorted(source.iterdir()):
                size = f.stat().st_size
                name = f.name.encode()
                s.sendall(struct.pack("!IQ", len(name), size) + name)
                with f.open("rb") as fh:
                    if size:
                        s.sendfile(fh)
                sent += size
            s.shutdown(socket.SHUT_WR)
        rx.join()
    finally:
        if relay is not None:
            relay.stop()  # once the receiver has had everything
    if errors:
        raise BenchmarkError(f"copying the images to {dst.name}: {errors[0]!r}")
    return sent


def last_step(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        steps = STEP.findall(path.read_bytes())
        return int(steps[-1]) if steps else 0
    return 0


def plain_migration(net: TestNet, mb: int, src: str, dst: str, delay: float = 0.0) -> dict[str, Any]:
    """Plain CRIU: a holder on ``src``; dump it there, send the images to ``dst`` (``delay``: seconds added
    each way), restore it there."""
    a, b = net[src], net[dst]
    work = net.shared / "plain"
    work.mkdir(exist_ok=True)
    out_path = work / "output.log"
    images_a = Path("/dev/shm") / f"tidal-bench-plain-{net.tag}-{src}"
    images_b = Path("/dev/shm") / f"tidal-bench-plain-{net.tag}-{dst}"
    restored = 0
    try:
        with out_path.open("wb") as out:
            proc = a.popen([sys.executable, "-c", HOLDER.format(mb=mb)], stdout=out, stderr=subprocess.STDOUT,
                           cwd=work)
        wait_for(lambda: last_step(out_path) >= 20, 120, "the plain holder's step 20", interval=0.05)
        images_a.mkdir()
        step0 = last_step(out_path)
        t0 = time.perf_counter()
        criu_on(a, "dump", "-t", str(proc.pid), "--manage-cgroups=ignore", images=images_a, log="dump.log")
        t_dump = time.perf_counter()
        proc.wait(10)  # reaped: its pid is free for the restore
        image_bytes = sum(f.stat().st_size for f in images_a.iterdir() if f.suffix == ".img")
        sent = send_dir(a, b, images_a, images_b, delay)
        t_copy = time.perf_counter()
        criu_on(b, "restore", "-d", "--pidfile", str(images_b / "pid"), "--manage-cgroups=ignore",
                images=images_b, log="restore.log")
        t_restored = time.perf_counter()
        restored = int((images_b / "pid").read_text())
        wait_for(lambda: last_step(out_path) > step0, 60, "the restored holder's next step", interval=0.001)
        t_step = time.perf_counter()
        return {"image_bytes": image_bytes, "sent_bytes": sent, "dump_s": t_dump - t0, "copy_s": t_copy - t_dump,
                "restore_s": t_restored - t_copy, "to_running_s": t_restored - t0, "to_next_step_s": t_step - t0,
                "copy_mib_per_s": sent / MB / (t_copy - t_dump)}
    finally:
        if restored:
            with contextlib.suppress(ProcessLookupError):
                os.kill(restored, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(restored, 0)
        for d in (images_a, images_b):
            subprocess.run(["rm", "-rf", str(d)], check=False)


# -- Tidal across hosts ----------------------------------------------------------------------------------


def rank_log(cluster: HostCluster, node: str, job: str) -> Path:
    return cluster.agents[node].root / "ranks" / job / "0" / "output.log"


def tidal_migration(cluster: HostCluster, job: str, src: str, dst: str,
                    body: dict[str, Any] | None = None) -> dict[str, Any]:
    """``POST migrate {"to": dst}`` (or ``body``) of the job running on ``src``: seconds to running on ``dst``,
    and to the first step it prints there; the job's events since (with the request's wall-clock time)."""
    before = {c["id"] for c in cluster.job(job)["checkpoints"]}
    with cluster.api() as api:
        seen = max((e["seq"] for e in api.get("/v1/events", params={"job": job, "limit": 10000}).json()), default=0)
    step0 = last_step(rank_log(cluster, src, job))
    dst_log = rank_log(cluster, dst, job)
    with cluster.api() as api:
        requested_at, t0 = time.time(), time.perf_counter()
        r = api.post(f"/v1/jobs/{job}/migrate", json=body or {"to": dst})
        if r.status_code != 200:
            raise BenchmarkError(f"migrate: {r.status_code} {r.text}")
        t_running = t_step = None
        deadline = time.monotonic() + 600
        while (t_running is None or t_step is None) and time.monotonic() < deadline:
            if t_step is None and last_step(dst_log) > step0:
                t_step = time.perf_counter()
            if t_running is None:
                j = api.get(f"/v1/jobs/{job}").json()
                pl = j.get("placement") or []
                if (j["state"] == "running" and not j.get("busy") and pl
                        and all(p.get("pid") and p["node"] == dst for p in pl)):
                    t_running = time.perf_counter()
            time.sleep(0.005)
    if t_running is None or t_step is None:
        raise BenchmarkError(f"job {job} did not come back on {dst}: {cluster.job(job)}\n{cluster.diagnostics()}")
    new = [c for c in cluster.job(job)["checkpoints"] if c["id"] not in before]
    with cluster.api() as api:
        events = api.get("/v1/events", params={"job": job, "after": seen, "limit": 10000}).json()
    return {"to_running_s": t_running - t0, "to_next_step_s": t_step - t0, "requested_at": requested_at,
            "checkpoint": new[-1] if new else None,
            "events": [{k: e.get(k) for k in ("time", "kind", "node", "detail")} for e in events]}


def migrations(net: TestNet, cluster: HostCluster, mb: int) -> dict[str, Any]:
    say(f"plain CRIU: a {mb} MiB holder on n1 → dump, copy over TCP, restore on n2")
    plain = plain_migration(net, mb, "n1", "n2")
    work = net.shared / "work"
    work.mkdir(exist_ok=True)
    job = cluster.submit([sys.executable, "-c", HOLDER.format(mb=mb)], cwd=work)
    placed = cluster.running_on(job, timeout=300)
    if placed[0][0] != "n1":
        raise BenchmarkError(f"the job started on {placed[0][0]}, not n1")
    wait_for(lambda: last_step(rank_log(cluster, "n1", job)) >= 20, 120, "the job's step 20", interval=0.05)
    say("tidal: migrate n1 → n2 (the store holds nothing of the job)")
    first = tidal_migration(cluster, job, "n1", "n2")
    time.sleep(5)
    say("tidal: migrate n2 → n1 (the store holds the previous checkpoint)")
    second = tidal_migration(cluster, job, "n2", "n1")
    with cluster.api() as api:
        api.post(f"/v1/jobs/{job}/cancel")
    cluster.wait_state(job, "cancelled", timeout=120)
    return {"plain": plain, "tidal_first": first, "tidal_second": second,
            "first_vs_plain_running": first["to_running_s"] / plain["to_running_s"],
            "first_vs_plain_next_step": first["to_next_step_s"] / plain["to_next_step_s"],
            "second_vs_plain_running": second["to_running_s"] / plain["to_running_s"],
            "second_vs_plain_next_step": second["to_next_step_s"] / plain["to_next_step_s"]}


# -- submissions -----------------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu_s(host: Host) -> float:
    total = 0.0
    for pid in host.pids():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += cpu_s(pid)
    return total


def submissions(net: TestNet, cluster: HostCluster, where: str, n: int, clients: int) -> dict[str, Any]:
    """``n`` submissions from ``clients`` processes on host ``where``."""
    assert cluster.server_proc is not None
    work = net.shared / "submit"
    work.mkdir(exist_ok=True)
    cfg = {"addr": cluster.server_host.addr, "port": SERVER_PORT, "ca": str(cluster.ca), "token": cluster.user_token,
           "n": n, "clients": clients,
           "body": {"command": ["true"], "workdir": str(work), "tier": "basic"}}
    server, db = cluster.server_proc.pid, net["db"]
    cpu0, db0 = cpu_s(server), host_cpu_s(db)
    p = net[where].run([sys.executable, "-c", LOADGEN, json.dumps(cfg)], timeout=1800)
    cpu1, db1 = cpu_s(server), host_cpu_s(db)
    res = json.loads(p.stdout)
    bad = sum(r["n_bad"] for r in res)
    if bad:
        raise BenchmarkError(f"{bad} of {n} submissions were refused, e.g. {next(r['bad'] for r in res if r['bad'])}")
    lat = sorted(x for r in res for x in r["lat"])
    wall = max(r["end"] for r in res) - min(r["start"] for r in res)
    return {"from_host": where, "submissions": n, "clients": clients, "wall_s": wall,
            "submissions_per_s": n / wall, "p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "mean_ms": 1000 * statistics.fmean(lat),
            "server_cpu_ms_per_submission": 1000 * (cpu1 - cpu0) / n,
            "postgres_cpu_ms_per_submission": 1000 * (db1 - db0) / n,
            "client_cpu_ms_per_submission": 1000 * sum(r["cpu"] for r in res) / n}


def cancel_all(cluster: HostCluster) -> int:
    with cluster.api(cluster.admin_token) as api:
        ids = [j["id"] for j in api.get("/v1/jobs", params={"all": "true", "limit": 10000}).json()
               if j["state"] == "pending"]

    def cancel(ids: list[str]) -> None:
        with cluster.api(cluster.admin_token) as c:
            for job in ids:
                c.post(f"/v1/jobs/{job}/cancel")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(cancel, [ids[i::4] for i in range(4)]))
    return len(ids)


def submission_runs(net: TestNet, cluster: HostCluster, n: int, clients: int) -> dict[str, Any]:
    # Every device busy (a sleeper on each node): the submitted jobs wait, and the scheduler has nothing
    # to decide (see the module's documentation).
    sleepers = [cluster.submit(["sleep", "1000000"], cwd=net.shared) for _ in cluster.agents]
    for job in sleepers:
        cluster.running_on(job)
    # Two rounds, the two places alternating (the machine's load drifts); the better of each place's two.
    runs: dict[str, list[dict[str, Any]]] = {"client": [], "cp": []}
    for i in range(2):
        for where in ("client", "cp"):
            say(f"submissions, round {i + 1} of 2: {n} from {clients} clients on host {where}")
            runs[where].append(submissions(net, cluster, where, n, clients))
            say(f"  {runs[where][-1]['submissions_per_s']:.0f}/s; cancelling them")
            cancel_all(cluster)
    out: dict[str, Any] = {w: max(rs, key=lambda r: r["submissions_per_s"]) for w, rs in runs.items()}
    out["rounds_per_s"] = {w: [r["submissions_per_s"] for r in rs] for w, rs in runs.items()}
    out["remote_vs_same_host"] = out["client"]["submissions_per_s"] / out["cp"]["submissions_per_s"]
    return out


def main() -> int:
    p = arguments(__doc__, "/var/tmp/tidal-bench-crosshost")
    p.add_argument("--mb", type=int, default=1280, help="the migrated job's memory, MiB (default 1280)")
    p.add_argument("--submissions", type=int, default=2000, help="submissions per run (default 2000)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--quick", action="store_true", help="--mb 200 --submissions 300")
    p.add_argument("--only", choices=("migration", "submissions"), help="run one part only")
    p.add_argument("--logs", type=Path, help="copy the server's and the agents' logs here at the end")
    p.add_argument("--store-concurrency", type=int, help="the agents' TIDAL_STORE_CONCURRENCY (default: theirs)")
    args = p.parse_args()
    if args.quick:
        args.mb, args.submissions = 200, 300
    host_ranks()
    out: dict[str, Any] = {"machine": {**machine(), "load_average_at_start": os.getloadavg()}, "mb": args.mb,
                           "store_concurrency": args.store_concurrency}
    agent_env = {"TIDAL_STORE_CONCURRENCY": str(args.store_concurrency)} if args.store_concurrency else {}
    with TestNet(names=["cp", "db", "s3", "n1", "n2", "client"]) as net:
        say("starting PostgreSQL (db), SeaweedFS (s3), tidal server (cp), agents (n1, n2)")
        cluster = HostCluster(net, nodes=["n1", "n2"], agent_env=agent_env,
                              seaweedfs={"volume_size_mb": 1024, "volumes": 32})
        try:
            if args.only != "submissions":
                out["migration"] = migrations(net, cluster, args.mb)
            if args.only != "migration":
                out["submissions"] = submission_runs(net, cluster, args.submissions, args.clients)
        finally:
            if args.logs is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in (cluster.server_log, *(a.log for a in cluster.agents.values())):
                    with contextlib.suppress(FileNotFoundError):
                        (args.logs / f"{log.parent.name}-{log.name}").write_bytes(log.read_bytes())
    m = out["machine"]
    m["load_average_at_end"] = os.getloadavg()
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / (1 << 30):.0f} GiB, kernel {m['kernel']}, "
          f"CRIU {m['criu']}; test hosts on one bridge (veth), all on these cores; load average "
          f"{m['load_average_at_start'][0]:.1f} at the start, {m['load_average_at_end'][0]:.1f} at the end")
    if "migration" in out:
        mig = out["migration"]
        pl, f, s = mig["plain"], mig["tidal_first"], mig["tidal_second"]
        print(f"\nmigration of a {args.mb} MiB job n1 → n2 (image {pl['image_bytes'] / MB:.0f} MiB); "
              f"store concurrency {args.store_concurrency or 'default'}")
        print(f"{'':44}{'→ running s':>14}{'→ next step s':>15}{'vs plain':>10}")
        print(f"{'plain CRIU: dump, TCP copy, restore':44}{pl['to_running_s']:>14.2f}{pl['to_next_step_s']:>15.2f}"
              f"{'1.00':>10}")
        print(f"{'   (dump / copy / restore)':44}{pl['dump_s']:>6.2f} / {pl['copy_s']:.2f} / {pl['restore_s']:.2f}"
              f"  copy {pl['copy_mib_per_s']:.0f} MiB/s")
        for label, r in (("tidal via SeaweedFS, store empty", f), ("tidal via SeaweedFS, back (store warm)", s)):
            print(f"{label:44}{r['to_running_s']:>14.2f}{r['to_next_step_s']:>15.2f}"
                  f"{r['to_next_step_s'] / pl['to_next_step_s']:>10.2f}")
            for e in r["events"]:
                if e["kind"] in ("prestaged", "prestage_failed", "checkpointing", "migrating", "running"):
                    print(f"   {e['kind']}: {e['detail']}"[:160])
    if "submissions" in out:
        print(f"\nsubmissions through the API (PostgreSQL on db), {args.clients} clients, {args.submissions} each run")
        print(f"{'clients on':14}{'per s':>8}{'p50 ms':>8}{'p99 ms':>8}{'server CPU ms':>15}{'PG CPU ms':>11}"
              f"{'client CPU ms':>15}")
        for where in ("client", "cp"):
            r = out["submissions"][where]
            print(f"{where:14}{r['submissions_per_s']:>8.0f}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}"
                  f"{r['server_cpu_ms_per_submission']:>15.2f}{r['postgres_cpu_ms_per_submission']:>11.2f}"
                  f"{r['client_cpu_ms_per_submission']:>15.2f}")
        print(f"remote / same host: {out['submissions']['remote_vs_same_host']:.2f}")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    run(main)
