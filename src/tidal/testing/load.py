"""Load on a control plane, for the noisy-neighbour test and ``benchmarks/load.py``: one user's clients
submitting as fast as they are answered (:func:`flood`), and agents speaking the real agent protocol with
nothing behind them (:class:`SimulatedAgent`), which measure how long their heartbeats take against the lease.

Every loop here is bounded in time and count, and talks only to the URL it is given (loopback, or a test
host's address). ``python -m tidal.testing.load flood ...`` runs a flood in a process of its own (a test
runs it there, at a low CPU priority, standing for a user on another machine) and prints its tally as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tidal.core import protocol

#: How long a simulated agent's long-poll for actions waits (tidal.agent's).
POLL_WAIT_S = 10.0
#: The most requests one client of a flood sends, whatever its duration (a bound on the loop).
MAX_REQUESTS_PER_CLIENT = 200_000


@dataclass
class Tally:
    """What a flood's clients were answered: requests by HTTP status, the Retry-After values of its 429s,
    the errors that were not answers, and each answer's latency (seconds)."""

    statuses: Counter[int] = field(default_factory=Counter)
    retry_after: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        self.statuses.update(other.statuses)
        self.retry_after.update(other.retry_after)
        self.errors.update(other.errors)
        self.latencies.extend(other.latencies)

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {"statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "retry_after": dict(self.retry_after), "errors": dict(self.errors), "seconds": self.seconds,
                "requests": len(lat), "p50_s": percentile(lat, 0.5), "p99_s": percentile(lat, 0.99)}


def percentile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` (sorted), nearest rank; None when empty."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def flood(url: str, token: str, body: dict[str, Any], *, clients: int = 20, seconds: float = 60.0,
          honour_retry_after: bool = True, verify: Any = True) -> Tally:
    """``clients`` threads, each with its own keep-alive connection, POST ``body`` to /v1/jobs for ``seconds``,
    each sending its next request as soon as it has its answer, or, after a 429, once its Retry-After has
    passed (as Tidal's own client does) unless ``honour_retry_after`` is false (a client that ignores it)."""
    tallies = [Tally() for _ in range(clients)]
    end = time.monotonic() + seconds

    def client(t: Tally) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                          verify=verify) as c:
            for _ in range(MAX_REQUESTS_PER_CLIENT):
                now = time.monotonic()
                if now >= end:
                    return
                try:
                    r = c.post("/v1/jobs", json=body)
                except httpx.HTTPError as exc:
                    t.errors[type(exc).__name__] += 1
                    continue
                finally:
                    t.latencies.append(time.monotonic() - now)
                t.statuses[r.status_code] += 1
                if r.status_code == 429:
                    after = r.headers.get("retry-after", "")
                    t.retry_after[after] += 1
                    if honour_retry_after:
                        wait = float(after) if after.isdigit() else 1.0
                        time.sleep(max(0.0, min(wait, end - time.monotonic())))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(t,), daemon=True) for t in tallies]
    for th in threads:
        th.start()
    for th in threads:
        th.join(seconds + 60)
    total = Tally(seconds=time.monotonic() - t0)
    for t in tallies:
        total.add(t)
    return total


class SimulatedAgent:
    """A node's agent with nothing behind it: it registers ``name`` with ``devices`` devices, then heartbeats
    every fifth of its lease (as :mod:`tidal.agent` does) and long-polls for actions, acknowledging each as
    done without running anything. It counts its heartbeats' latencies and the leases it lost (a heartbeat
    answered 409, or none answered within the agent's request timeout, a quarter of the lease)."""

    def __init__(self, url: str, token: str, name: str, devices: int = 8, *, verify: Any = True) -> None:
        self.url, self.name, self.devices = url, name, devices
        self.agent_id = f"sim-{secrets.token_hex(4)}"
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, verify=verify,
                                 timeout=30)
        self.poll = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, verify=verify,
                                 timeout=30)
        self.lease_s = 5.0
        self.latencies: list[float] = []
        self.late = 0  # heartbeats not answered within the request timeout
        self.refused = 0  # heartbeats answered with an error (a lost lease: 409)
        self.actions = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def register(self) -> None:
        r = self.http.post("/v1/agent/register", json={
            "name": self.name, "agent_id": self.agent_id, "devices": self.devices,
            "cpus": [[i] for i in range(self.devices)]})
        r.raise_for_status()
        self.lease_s = float(r.json()["lease_s"])

    def start(self) -> None:
        self.register()
        for target in (self._beat, self._take):
            th = threading.Thread(target=target, daemon=True, name=f"{self.name}-{target.__name__}")
            th.start()
            self._threads.append(th)

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(self.lease_s + POLL_WAIT_S + 35)
        self.http.close()
        self.poll.close()

    def _beat(self) -> None:
        timeout = self.lease_s / 4
        while not self._stop.wait(self.lease_s / 5):
            t0 = time.monotonic()
            try:
                r = self.http.post(f"/v1/agent/{self.name}/heartbeat", json={"agent_id": self.agent_id},
                                   timeout=timeout)
            except httpx.TimeoutException:
                self.late += 1
                self.latencies.append(time.monotonic() - t0)
                continue
            except httpx.HTTPError:
                self.refused += 1
                continue
            self.latencies.append(time.monotonic() - t0)
            if r.status_code != 200:
                self.refused += 1
                if r.status_code == 409:  # its lease was lost: take the node again, as an agent does
                    self.agent_id = f"sim-{secrets.token_hex(4)}"
                    with contextlib.suppress(httpx.HTTPError):
                        self.register()

    def _take(self) -> None:
        while not self._stop.is_set():
            try:
                r = self.poll.get(f"/v1/agent/{self.name}/actions",
                                  params={"agent_id": self.agent_id, "wait": POLL_WAIT_S})
            except httpx.HTTPError:
                self._stop.wait(0.5)
                continue
            if r.status_code != 200:
                self._stop.wait(0.5)
                continue
            for a in r.json():
                self.actions += 1
                self._acknowledge(a)

    def _acknowledge(self, wire: dict[str, Any]) -> None:
        """Report an action done with the least its result may say: a launch's or restore's ranks started (a
        made-up pid each), a kill's ranks ended; any other order done."""
        action = protocol.decode_action(wire)
        order = action.order
        data: dict[str, Any] = {}
        if isinstance(order, protocol.Launch | protocol.Restore):
            data = {"ranks": [{"rank": r.rank, "pid": 100000 + r.rank} for r in order.ranks]}
        elif isinstance(order, protocol.Kill):
            data = {"ranks": []}
        with contextlib.suppress(httpx.HTTPError):
            self.http.post(f"/v1/agent/{self.name}/results", json={
                "agent_id": self.agent_id, "action_id": action.id, "ok": True, "data": data})


@dataclass
class UserTally:
    """A mixed user workload's answers: per route (submit, list, cancel), each request's latency and status."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    def note(self, route: str, seconds: float, status: int) -> None:
        self.latencies.setdefault(route, []).append(seconds)
        self.statuses.setdefault(route, Counter())[status] += 1

    def add(self, other: UserTally) -> None:
        for route, lat in other.latencies.items():
            self.latencies.setdefault(route, []).extend(lat)
        for route, st in other.statuses.items():
            self.statuses.setdefault(route, Counter()).update(st)
        self.errors.update(other.errors)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"errors": dict(self.errors), "routes": {}}
        for route, lat in sorted(self.latencies.items()):
            ordered = sorted(lat)
            out["routes"][route] = {"requests": len(ordered), "p50_s": percentile(ordered, 0.5),
                                    "p99_s": percentile(ordered, 0.99),
                                    "statuses": {str(k): v for k, v in sorted(self.statuses[route].items())}}
        return out


def users(url: str, tokens: list[str], body: dict[str, Any], *, seconds: float, clients_per_user: int = 1,
          list_every: int = 5, cancel_every: int = 10, verify: Any = True) -> UserTally:
    """Each user (a token) runs ``clients_per_user`` clients for ``seconds``, each a loop of submissions, with a
    listing of the user's newest 50 jobs after every ``list_every``-th and a cancel of one of the jobs it
    submitted after every ``cancel_every``-th."""
    end = time.monotonic() + seconds
    tallies: list[UserTally] = []

    def client(token: str, t: UserTally) -> None:
        mine: list[str] = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                          verify=verify) as c:
            for n in range(1, MAX_REQUESTS_PER_CLIENT):
                if time.monotonic() >= end:
                    return
                calls: list[tuple[str, str, str, dict[str, Any] | None]] = [("submit", "POST", "/v1/jobs", body)]
                if n % list_every == 0:
                    calls.append(("list", "GET", "/v1/jobs?limit=50", None))
                if n % cancel_every == 0 and mine:
                    calls.append(("cancel", "POST", f"/v1/jobs/{mine.pop(0)}/cancel", None))
                for route, method, path, js in calls:
                    t0 = time.monotonic()
                    try:
                        r = c.request(method, path, json=js)
                    except httpx.HTTPError as exc:
                        t.errors[type(exc).__name__] += 1
                        continue
                    t.note(route, time.monotonic() - t0, r.status_code)
                    if route == "submit" and r.status_code == 201:
                        mine.append(r.json()["id"])

    threads = []
    for token in tokens:
        for _ in range(clients_per_user):
            t = UserTally()
            tallies.append(t)
            threads.append(threading.Thread(target=client, args=(token, t), daemon=True))
    for th in threads:
        th.start()
    for th in threads:
        th.join(seconds + 60)
    total = UserTally()
    for t in tallies:
        total.add(t)
    return total


def agents(url: str, token: str, names: list[str], devices: int, seconds: float, *,
           verify: Any = True) -> dict[str, Any]:
    """Run a simulated agent for each of ``names`` for ``seconds``; what their heartbeats met."""
    sims = [SimulatedAgent(url, token, n, devices, verify=verify) for n in names]
    for a in sims:
        a.start()
    time.sleep(seconds)
    for a in sims:
        a._stop.set()
    for a in sims:
        a.stop()
    lat = sorted(x for a in sims for x in a.latencies)
    return {"agents": len(sims), "heartbeats": len(lat), "p50_s": percentile(lat, 0.5),
            "p99_s": percentile(lat, 0.99), "max_s": lat[-1] if lat else None,
            "late": sum(a.late for a in sims), "refused": sum(a.refused for a in sims),
            "actions": sum(a.actions for a in sims), "lease_s": sims[0].lease_s if sims else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tidal.testing.load")
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("flood", help="POST a job body to /v1/jobs from several clients for a while")
    f.add_argument("--url", required=True)
    f.add_argument("--token-file", required=True)
    f.add_argument("--body", required=True, help="the job's submission, JSON")
    f.add_argument("--clients", type=int, default=20)
    f.add_argument("--seconds", type=float, default=60.0)
    f.add_argument("--ignore-retry-after", action="store_true")
    f.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much")
    a = sub.add_parser("agents", help="simulated agents that heartbeat and acknowledge their actions for a while")
    a.add_argument("--url", required=True)
    a.add_argument("--token-file", required=True, help="the cluster's agent credential")
    a.add_argument("--names", required=True, help="the nodes' names, comma-separated")
    a.add_argument("--devices", type=int, default=8)
    a.add_argument("--seconds", type=float, default=60.0)
    u = sub.add_parser("users", help="users submitting, listing and cancelling for a while")
    u.add_argument("--url", required=True)
    u.add_argument("--token-files", required=True, help="one file per user, comma-separated")
    u.add_argument("--body", required=True, help="the job's submission, JSON")
    u.add_argument("--clients-per-user", type=int, default=1)
    u.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    if args.what == "flood":
        if args.nice:
            os.nice(args.nice)
        tally = flood(args.url, _read(args.token_file), json.loads(args.body), clients=args.clients,
                      seconds=args.seconds, honour_retry_after=not args.ignore_retry_after)
        print(json.dumps(tally.to_json()), flush=True)
    elif args.what == "agents":
        print(json.dumps(agents(args.url, _read(args.token_file), args.names.split(","), args.devices,
                                args.seconds)), flush=True)
    else:
        tokens = [_read(f) for f in args.token_files.split(",")]
        print(json.dumps(users(args.url, tokens, json.loads(args.body), seconds=args.seconds,
                               clients_per_user=args.clients_per_user).to_json()), flush=True)


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


if __name__ == "__main__":
    main()
