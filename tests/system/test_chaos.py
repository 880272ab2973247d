"""Reliability under faults: jobs on a live cluster while, at random moments, the control plane is killed
(SIGKILL) and restarted, an agent is killed and restarted, a checkpoint's commit is interrupted (the agent
doing it is killed while the job is checkpointing, also in the middle of a migration or preemption it was
asked for) and the checkpoint store fills up and is freed again.

At the end every job has finished with the output of an uninterrupted run, no device is held, and every
checkpoint the API ever listed as committed either still verifies in the store or was retired by
retention (only ever older ones than those kept). The accounting adds up: a job's restarts, starts and
checkpoints are those its events tell.

The faults, their order and the delays around them come from ``random.Random(seed)``: the seed is
``TIDAL_CHAOS_SEED`` when set (``random`` for a fresh one), else a fixed one, so that CI runs the same
schedule every time. It is printed with every fault and in every assertion
message; ``TIDAL_CHAOS_SEED=N pytest tests/system/test_chaos.py`` replays that schedule (what a fault hits
also depends on timing: which job happens to be checkpointing when it strikes).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.system.cluster import LiveCluster
from tests.system.test_distributed import DDP, ENV, _rank_lines, _steps_done, torchrun
from tidal.errors import CheckpointError
from tidal.mechanisms.criu import cgroups
from tidal.mechanisms.criu.rank import NodeRoot
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.manifest import MANIFEST, sequence_of
from tidal.testing import WaitTimeout, wait_until

pytestmark = [pytest.mark.criu, pytest.mark.slow]
FAULTS = ("control_plane", "agent", "commit", "store_full")
DEFAULT_SEED = 20261125
KEEP = 3  # TIDAL_KEEP_CHECKPOINTS: the cluster's default
# A checkpoint event names the committed checkpoint: "checkpoint 000004-a1b2c3 (1.2 MiB...".
COMMITTED = re.compile(r"\bcheckpoint (\d{6}-[0-9a-f]+) \(")
RESTART = re.compile(r"; restart (\d+)/\d+, ")


class Chaos:
    """The seeded schedule of a chaos test, and its log (printed: pytest shows it for a failed test)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.t0 = time.monotonic()

    def __str__(self) -> str:
        return f"TIDAL_CHAOS_SEED={self.seed}"

    def say(self, what: str) -> str:
        """An assertion message that says how to replay the run."""
        return f"{what} [replay: {self}]"

    def log(self, what: str) -> None:
        print(f"[chaos {self} +{time.monotonic() - self.t0:6.1f}s] {what}", flush=True)

    def pause(self, lo: float, hi: float, why: str) -> None:
        """A delay drawn by the generator (at most ``hi`` seconds): it puts a fault at a random moment.
        Everything else waits for what it needs to see, with a timeout."""
        t = self.rng.uniform(lo, hi)
        self.log(f"{why} {t:.2f}s")
        time.sleep(t)

    def wait(self, cond: Callable[[], Any], timeout: float, what: str,
             context: Callable[[], str] | None = None, every: float = 0.05) -> Any:
        """Poll ``cond`` every ``every`` seconds until it holds; fail after ``timeout`` with ``context()``."""
        try:
            return wait_until(cond, timeout=timeout, what=what, interval=every)
        except WaitTimeout as e:
            more = f"\n{context()}" if context else ""
            raise AssertionError(self.say(str(e)) + more) from e


@pytest.fixture
def chaos(request: pytest.FixtureRequest) -> Chaos:
    env = os.environ.get("TIDAL_CHAOS_SEED", str(DEFAULT_SEED))
    seed = random.SystemRandom().randrange(1 << 31) if env == "random" else int(env)
    # Shown with the failure of the test whatever fails (a timeout, a crash in a helper).
    request.node.add_report_section("setup", "chaos seed", f"TIDAL_CHAOS_SEED={seed}\n")
    ch = Chaos(seed)
    ch.log("seed")
    return ch


@dataclass
class SmallStore:
    """The checkpoint store on a small tmpfs of its own, which the test can fill to the last byte."""

    mount: Path

    @property
    def root(self) -> Path:
        return self.mount / "store"

    @property
    def filler(self) -> Path:
        return self.mount / "filler"

    def fill(self) -> int:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            with contextlib.suppress(OSError):  # someone took some meanwhile: the writes below fill the rest
                os.posix_fallocate(fd, 0, shutil.disk_usage(self.mount).free)
            for size in (1 << 16, 4096, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Callable[[str], SmallStore]]:
    """Mounts made by the test. Requested before ``make_cluster``, so unmounted after the cluster is down."""
    mounts: list[Path] = []

    def make(size: str) -> SmallStore:
        mnt = tmp_path / f"store-{len(mounts)}"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)], check=True)
        mounts.append(mnt)
        return SmallStore(mnt)

    yield make
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


class Tracker:
    """Every checkpoint the API lists as committed, at any moment of the test: one job asked every
    ``every`` seconds, in turn (the control plane may be down: then nobody answers, and nothing changes).

    Each one listed must be in the store: a checkpoint leaves the store only once the control plane has
    retired it, and a retired one is never listed again. So one missing from the store and listed by the
    API after that is lost, however briefly (a restore, or a fallback to an older checkpoint, could ask
    for it)."""

    def __init__(self, c: LiveCluster, jobs: list[str], store: Path, every: float) -> None:
        self.c = c
        self.jobs = jobs
        self.store = store
        self.every = every
        self.seen: dict[str, dict[str, list[str]]] = {j: {} for j in jobs}
        self.lost: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-tracker")
        self._thread.start()

    def _listed(self, api: httpx.Client, job: str) -> dict[str, list[str]] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = api.get(f"/v1/jobs/{job}/checkpoints")
            if r.status_code == 200:
                return {ck["id"]: list(ck["parts"]) for ck in r.json()}
        return None

    def _run(self) -> None:
        with self.c.api() as api:
            api.timeout = httpx.Timeout(5.0)
            while not self._stop.is_set():
                for job in self.jobs:
                    listed = self._listed(api, job) or {}
                    for ck, parts in listed.items():
                        self.seen[job].setdefault(ck, parts)
                        missing = [p for p in parts if not (self.store / "jobs" / job / p / MANIFEST).exists()]
                        if missing and ck in (self._listed(api, job) or {}):
                            why = f"job {job}: checkpoint {ck} listed, parts {missing} not in the store"
                            self.lost += [why] if why not in self.lost else []
                    if self._stop.wait(self.every):
                        return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _get(c: LiveCluster, path: str, **params: Any) -> Any:
    with c.api() as api:
        r = api.get(path, params=params)
        r.raise_for_status()
        return r.json()


def _post(c: LiveCluster, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    with c.api() as api:
        return api.post(path, json=body)


def _summaries(c: LiveCluster, jobs: list[str]) -> list[dict[str, Any]]:
    mine = set(jobs)
    return [j for j in _get(c, "/v1/jobs") if j["id"] in mine]


def describe(c: LiveCluster, jobs: list[str]) -> str:
    """Where the unfinished jobs are, for a failure message."""
    try:
        return _describe(c, jobs)
    except Exception as exc:  # the control plane may be what is broken
        return f"(the jobs cannot be described: {exc!r})"


def _describe(c: LiveCluster, jobs: list[str]) -> str:
    out = []
    for s in _summaries(c, jobs):
        if s["state"] in ("succeeded", "failed", "cancelled"):
            continue
        j = c.job(s["id"])
        out.append(f"job {j['id']}: {j['state']}{' (busy)' if j['busy'] else ''}, restarts {j['restarts']}, "
                   f"placement {[(p['node'], p['device']) for p in j['placement']]}; last events:")
        out += [f"    {e['kind']} {e['node'] or ''}: {(e['detail'] or '')[:160]}" for e in j["events"][-4:]]
    return "\n".join(out)


def _rank_processes(c: LiveCluster) -> dict[str, list[int]]:
    """Processes in the rank cgroups of the cluster's nodes (keyed by node root: other clusters on the
    machine have their own)."""
    out = {}
    hierarchy = cgroups.hierarchy()
    for name in c.state.agents:
        for group in hierarchy.rank_groups(NodeRoot.of_agent(name, c.home / "nodes" / name).name):
            if pids := group.procs():
                out[str(group.path)] = pids
    return out


def _last_event(c: LiveCluster) -> int:
    evs = _get(c, "/v1/events", last=1)
    return int(evs[-1]["seq"]) if evs else 0


def _reap(pid: int) -> None:
    # The cluster's processes are children of the test process (tidal up's code runs in it).
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@dataclass
class Faults:
    """The four faults, on cluster ``c`` running ``jobs``. Each heals what it broke before it returns (the
    process it killed runs again, the store has room again), without waiting for the jobs to recover: the
    next fault may strike in the middle of their recovery."""

    c: LiveCluster
    ch: Chaos
    store: SmallStore
    jobs: list[str]
    checkpoint_s: float  # about how long the jobs' checkpoints take: commit faults strike within that
    commit_s: float  # ... and their commits into the store
    counts: dict[str, int] = field(default_factory=dict)

    def strike(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        getattr(self, kind)()

    def describe(self) -> str:
        return describe(self.c, self.jobs)

    def _pick(self, items: list[str], u: float) -> str:
        # ``u`` is drawn whatever there is to choose from, so that the random stream stays the seed's.
        return sorted(items)[int(u * len(items))]

    def _active(self) -> list[dict[str, Any]]:
        """Summaries (state, nodes) of the jobs placed on nodes: one request, however many jobs."""
        return [j for j in _summaries(self.c, self.jobs) if j["nodes"]]

    def control_plane(self) -> None:
        pid = self.c.state.server.pid
        self.ch.log(f"SIGKILL the control plane (pid {pid})")
        os.kill(pid, signal.SIGKILL)
        _reap(pid)
        self.ch.pause(0.0, 3.0, "control plane down for")
        started = self.c.restart()
        assert "control plane" in started, self.ch.say(f"restart started {started}")
        self.ch.log("control plane restarted")

    def _kill_agent(self, node: str, why: str, then: Callable[[], str] | None = None) -> None:
        pid = self.c.state.agents[node].pid
        os.kill(pid, signal.SIGKILL)
        self.ch.log(f"SIGKILL the agent of {node} (pid {pid}): {why}" + (f"; {then()}" if then else ""))
        _reap(pid)
        self.ch.pause(0.0, 2.0, f"{node} without an agent for")
        started = self.c.restart()  # its lease must expire first: the new agent waits for that
        assert node in started, self.ch.say(f"restart started {started}, not {node}")
        self.ch.log(f"agent of {node} restarted")

    def agent(self) -> None:
        u = self.ch.rng.random()
        busy = sorted({n for j in self._active() for n in j["nodes"]})
        node = self._pick(busy or list(self.c.state.agents), u)
        self._kill_agent(node, "a node of running jobs" if busy else "an idle node")

    def _request(self, u: float) -> tuple[str, str] | None:
        """Ask a running job to move (or, where it cannot, to be preempted): a checkpoint-and-kill."""
        ready = [j["id"] for j in self._active() if j["state"] == "running"]
        if not ready:
            return None
        j = self.c.job(self._pick(ready, u))
        free = sorted(n["name"] for n in _get(self.c, "/v1/nodes") if n["free"] > 0)
        if j["ranks"] > 1:
            r = int(u * 1000) % j["ranks"]
            here = next(p["node"] for p in j["placement"] if p["rank"] == r)
            to = [n for n in free if n != here]
            body = {"rank": r, "to": to[0]} if to else None
        else:
            body = {} if free else None
        if body is not None:
            resp = _post(self.c, f"/v1/jobs/{j['id']}/migrate", body)
            if resp.status_code == 200:
                return j["id"], f"migrate {body}"
        resp = _post(self.c, f"/v1/jobs/{j['id']}/preempt")
        return (j["id"], "preempt") if resp.status_code == 200 else None

    def _writing(self, jobs: list[str], before: set[Path]) -> Path | None:
        """A checkpoint of one of ``jobs`` being written into the store now (its pending references and no
        manifest yet), other than those of ``before`` (left by commits that were interrupted)."""
        for pending in sorted(self.store.root.glob("jobs/*/*/pending")):
            if (pending not in before and pending.parent.parent.name in jobs
                    and not (pending.parent / MANIFEST).exists()):
                return pending
        return None

    def commit(self) -> None:
        """Kill an agent while it checkpoints a job (a periodic checkpoint, or a migration or preemption that
        was asked for): at a random moment of the checkpoint (cut, dump, commit, finish), or of its commit
        into the store."""
        asked = self.ch.rng.random() < 0.5
        in_store = self.ch.rng.random() < 0.5
        u = self.ch.rng.random()
        delay = self.ch.rng.uniform(0.0, self.commit_s if in_store else self.checkpoint_s)
        before = set(self.store.root.glob("jobs/*/*/pending"))
        req = self._request(u) if asked else None
        job, how = req or (None, "periodic")
        nodes = {j["id"]: j["nodes"] for j in self._active()}
        if in_store:
            pending = self.ch.wait(lambda: self._writing([job] if job else self.jobs, before), 120,
                                   "a checkpoint to be written into the store", self.describe, every=0.001)
            job = pending.parent.parent.name
            where = nodes.get(job) or next((j["nodes"] for j in self._active() if j["id"] == job), [])
            time.sleep(delay)  # a random moment of the commit (a small job's takes a few milliseconds)
            node = self._pick(where or list(self.c.state.agents), u)
            self._kill_agent(node, f"job {job} writes checkpoint {pending.parent.name} ({how}), "
                             f"{delay:.3f}s after it was seen to begin", then=lambda: "its commit " + (
                                 "had just ended" if (pending.parent / MANIFEST).exists() else "is cut short"))
        else:
            if job is None:
                job = self.ch.wait(lambda: next((j["id"] for j in self._active()
                                                 if j["state"] == "checkpointing"), None),
                                   120, "a job to checkpoint", self.describe)
            self.ch.log(f"job {job} checkpointing ({how}); killing its agent in {delay:.2f}s")
            time.sleep(delay)  # a random moment of the checkpoint
            state = self.c.job(job)["state"]
            where = nodes.get(job) or next((j["nodes"] for j in self._active() if j["id"] == job), [])
            self._kill_agent(self._pick(where or list(self.c.state.agents), u), f"job {job} {state} ({how})")
        if how == "preempt":
            # A preemption that committed holds the job: let it go on (once it has settled).
            j = self.ch.wait(lambda: (x := self.c.job(job)) and not x["busy"] and x["state"] != "checkpointing"
                             and x, 180, f"job {job} to settle after its preemption", self.describe)
            if j["held"] or j["state"] == "held":
                self.ch.log(f"job {job} is held: resume")
                assert _post(self.c, f"/v1/jobs/{job}/resume").status_code == 200

    def store_full(self) -> None:
        seq = _last_event(self.c)
        n = self.store.fill()
        self.ch.log(f"store full ({n} bytes of filler)")

        def failed() -> bool:
            evs = _get(self.c, "/v1/events", after=seq)
            return any("checkpoint failed" in e["detail"] and re.search(r"full|No space", e["detail"])
                       for e in evs)

        # A checkpoint runs into it (each job checkpoints periodically; a job being restored does later).
        self.ch.wait(failed, 180, "a checkpoint to fail on the full store", self.describe)
        self.ch.log("a checkpoint failed on the full store")
        self.ch.pause(0.0, 3.0, "store stays full for")
        self.store.free()
        self.ch.log("store freed")


def run_chaos(faults: Faults, extra: int) -> None:
    """Every fault once and ``extra`` more, in a random order, each at a random moment."""
    ch = faults.ch
    schedule = [*FAULTS, *(ch.rng.choice(FAULTS) for _ in range(extra))]
    ch.rng.shuffle(schedule)
    ch.log(f"schedule: {schedule}")
    for kind in schedule:
        ch.pause(0.0, 4.0, f"next fault ({kind}) in")
        faults.strike(kind)


def check_outcome(c: LiveCluster, ch: Chaos, store: SmallStore, tracker: Tracker, jobs: list[str],
                  timeout: float) -> dict[str, dict[str, Any]]:
    """No job stuck, no device held, no committed checkpoint lost, the accounting consistent. Returns the
    jobs' final details."""
    def ended() -> bool:
        return all(j["state"] in ("succeeded", "failed", "cancelled") for j in _summaries(c, jobs))

    ch.wait(ended, timeout, "every job to end", lambda: describe(c, jobs))
    tracker.stop()
    assert not tracker.lost, ch.say(f"committed checkpoints missing from the store: {tracker.lost}")
    final = {j: c.job(j) for j in jobs}
    bad = {j: (d["state"], d["error"]) for j, d in final.items() if d["state"] != "succeeded"}
    assert not bad, ch.say(f"jobs that did not succeed: {bad}")

    # No device is held by a finished job, and nothing of theirs runs on any node.
    nodes = _get(c, "/v1/nodes")
    assert [(n["name"], n["up"], n["free"]) for n in nodes] == [(n["name"], True, n["devices"]) for n in nodes], \
        ch.say(f"devices still held: {nodes}")
    ch.wait(lambda: not _rank_processes(c), 10, "no rank processes left", lambda: str(_rank_processes(c)))

    st = CheckpointStore(store.root)
    try:
        for j, d in final.items():
            evs = d["events"]
            kept = {ck["id"]: ck["parts"] for ck in d["checkpoints"]}
            ever = {**tracker.seen[j], **kept}
            named = [m.group(1) for e in evs if (m := COMMITTED.search(e["detail"] or ""))]
            assert len(named) == len(set(named)), ch.say(f"job {j}: a checkpoint committed twice: {named}")
            ever_ids = set(ever) | set(named)
            # Checkpoint ids count the job's committed checkpoints: 1..n, each number committed once.
            n = max((sequence_of(i) for i in ever_ids), default=0)
            assert sorted(sequence_of(i) for i in kept) == list(range(n - min(n, KEEP) + 1, n + 1)), \
                ch.say(f"job {j}: kept {sorted(kept)} of {sorted(ever_ids)}")
            gone = sorted(i for i in ever_ids - set(kept) if sequence_of(i) >= n - min(n, KEEP) + 1)
            assert not gone, ch.say(f"job {j}: committed checkpoints lost, not retired by retention: {gone}")
            for ck, parts in sorted(kept.items()):
                for part in parts:
                    try:
                        st.verify(j, part)
                    except CheckpointError as exc:
                        raise AssertionError(ch.say(f"job {j}: kept checkpoint {ck} does not verify: {exc}")) from exc
            # Restarts, starts (launch or restore) and checkpoints as the events tell them.
            restarts = [int(m.group(1)) for e in evs if (m := RESTART.search(e["detail"] or ""))]
            assert restarts == list(range(1, d["restarts"] + 1)), \
                ch.say(f"job {j}: restarts {d['restarts']}, events say {restarts}")
            starts = [e for e in evs if e["kind"] in ("running", "restoring")
                      and (e["detail"] or "").startswith("on ")]
            assert len(starts) == d["attempt"], ch.say(f"job {j}: attempt {d['attempt']}, {len(starts)} starts")
            restored = sum("restoring from its latest checkpoint" in e["detail"] for e in starts)
            assert restored <= d["attempt"] - 1 and (n > 0 or restored == 0), \
                ch.say(f"job {j}: {restored} restores without a checkpoint")
    finally:
        st.close()
    left = sorted(str(d.relative_to(store.root)) for d in store.root.glob("jobs/*/*") if not (d / MANIFEST).exists())
    ch.log(f"store: {shutil.disk_usage(store.mount).used >> 20} MiB used; uncommitted checkpoints left: {left}")
    return final


# -- a DDP job --------------------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.timeout(900)
def test_ddp_job_under_chaos_is_identical_to_torchrun(small_store, make_cluster, chaos: Chaos,
                                                      tmp_path: Path) -> None:
    world, steps, held = 4, 300, 200
    args = ["--steps", str(steps), "--collectives"]
    # The step time and the gate only make it wait: the reference runs without them.
    expected, params = torchrun(tmp_path, world, [*args, "--step-time", "0"])
    gate = tmp_path / "gate"
    store = small_store("1g")
    c: LiveCluster = make_cluster(nodes=3, devices=2, lease=2.0, checkpoint_store=str(store.root))
    work = tmp_path / "work"
    work.mkdir()
    job = c.cli("submit", "-q", "--name", "ddp-chaos", "--ranks", str(world), "--checkpoint-every", "6s",
                "--max-restarts", "100", "--", sys.executable, str(DDP), *args, "--step-time", "0.05",
                "--gate", f"{gate}:{held}", cwd=work, env=ENV).stdout.strip()
    tracker = Tracker(c, [job], store.root, every=0.2)
    c.wait_state(job, "running", timeout=120)
    chaos.wait(lambda: _steps_done(c, job) >= 3, 120, "first steps")

    faults = Faults(c, chaos, store, [job], checkpoint_s=3.0, commit_s=1.0)
    run_chaos(faults, extra=2)
    chaos.log(f"faults done ({faults.counts}); job at step {_steps_done(c, job)}: opening the gate")
    gate.touch()

    final = check_outcome(c, chaos, store, tracker, [job], timeout=600)[job]
    assert _rank_lines(c, job, world) == expected, chaos.say("per-rank output differs from torchrun's")
    assert (work / "params.bin").read_bytes() == params, chaos.say("final parameters differ from torchrun's")
    chaos.log(f"ok: {final['restarts']} restarts, {final['attempt']} starts, "
              f"{len(tracker.seen[job])} checkpoints seen")


# -- 20 small jobs ------------------------------------------------------------------------------------------
# Numbered steps with deterministic values, a file rewritten at each step (put back by every restore), and,
# for some, a gate before the end (outside the working directory, which a restore rolls back) that keeps
# them alive until the faults are over. NAP only paces it: the reference runs without it.
SMALL = r"""
i=0
while [ $i -lt $STEPS ]; do
  i=$((i+1))
  v=$(( (i * 7919 + K * 104729) % 1009 ))
  echo "job $K step $i value $v"
  echo "$K $i $v" > last.txt
  sleep $NAP
done
if [ -n "$GATE" ]; then while [ ! -e "$GATE" ]; do sleep 0.1; done; fi
echo "job $K done"
"""


def _small_env(k: int) -> dict[str, str]:
    return {"K": str(k), "STEPS": str(100 + (k * 37) % 100)}


@pytest.mark.timeout(900)
def test_twenty_small_jobs_under_chaos(small_store, make_cluster, chaos: Chaos, tmp_path: Path) -> None:
    n = 20
    gate = tmp_path / "gate"
    expected: dict[int, tuple[bytes, bytes]] = {}
    for k in range(n):
        ref = tmp_path / f"ref-{k}"
        ref.mkdir()
        out = subprocess.run(["sh", "-c", SMALL], cwd=ref, capture_output=True, check=True, timeout=60,
                             env={**os.environ, **_small_env(k), "NAP": "0", "GATE": ""}).stdout
        expected[k] = out, (ref / "last.txt").read_bytes()

    store = small_store("128m")
    c: LiveCluster = make_cluster(nodes=3, devices=4, lease=2.0, checkpoint_store=str(store.root))
    ids: dict[int, str] = {}
    with c.api() as api:
        for k in range(n):
            work = tmp_path / f"work-{k}"
            work.mkdir()
            env = {**os.environ, **_small_env(k), "NAP": "0.1", "GATE": str(gate) if k % 4 == 0 else ""}
            r = api.post("/v1/jobs", json={"name": f"small-{k}", "command": ["sh", "-c", SMALL],
                                           "workdir": str(work), "env": env, "checkpoint_every": 3.0,
                                           "max_restarts": 100})
            assert r.status_code == 201, r.text
            ids[k] = r.json()["id"]
    jobs = list(ids.values())
    tracker = Tracker(c, jobs, store.root, every=0.05)
    chaos.wait(lambda: sum(j["state"] == "running" for j in _summaries(c, jobs)) >= 10, 120, "jobs to start")

    faults = Faults(c, chaos, store, jobs, checkpoint_s=0.15, commit_s=0.01)
    run_chaos(faults, extra=3)
    chaos.log(f"faults done ({faults.counts}): opening the gate")
    gate.touch()

    final = check_outcome(c, chaos, store, tracker, jobs, timeout=600)
    for k, j in ids.items():
        out, last = expected[k]
        got = c.cli("logs", j).stdout.encode()
        assert got == out, chaos.say(f"job {j} (small-{k}): output differs from the reference run")
        assert (tmp_path / f"work-{k}" / "last.txt").read_bytes() == last, chaos.say(f"job {j}: last.txt")
    restarts = sum(d["restarts"] for d in final.values())
    commits = sum(len(tracker.seen[j]) for j in jobs)
    chaos.log(f"ok: {restarts} restarts, {commits} checkpoints seen")
