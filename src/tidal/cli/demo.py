"""``tidal demo``: on a 2-node local cluster, a basic training job is preempted by a premium job, resumes
on the other node, is migrated once more and finishes with exactly the output of an uninterrupted run.
``tidal demo --mechanism`` shows the checkpoint mechanism alone, without the cluster; ``tidal demo
--distributed`` a 4-rank DDP job resized and moved rank by rank, identical to plain ``torchrun``; ``tidal demo
--hosts`` the first story on 3 test hosts (network namespaces on a private bridge), with the control plane
on PostgreSQL, checkpoints in S3 (SeaweedFS) and the job moving from host to host."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tidal.cli.output import console
from tidal.control.client import Client
from tidal.mechanisms.demo import demo_dir, example_script, run_mechanism_demo, until

if TYPE_CHECKING:
    from tidal.config import Settings


def _mechanism_demo(steps: int, keep: bool) -> bool:
    """The checkpoint mechanism alone (no control plane): told as it happens, then a table of what happened."""
    from rich.table import Table

    from tidal.config import load_settings  # here: `tidal --help` imports this module, and needs no settings

    home = load_settings().home
    console.print(f"[bold]Tidal demo[/] — the checkpoint mechanism alone, state under {home}")
    got = run_mechanism_demo(home, steps, keep, say=lambda text: console.print(text, highlight=False))
    table = Table(title="What happened")
    for col in ("event", "node", "pid", "checkpoint", "stored"):
        table.add_column(col)
    for row in got.rows:
        table.add_row(*row)
    table.add_row("finished", got.finished_on, "", "", str(got.status))
    console.print(table)
    console.print(f"Per-step output vs the uninterrupted run: {_verdict(got.same_log)} ({got.lines} lines); "
                  f"final parameters: {_verdict(got.same_params)}")
    return got.ok


def _verdict(same: bool) -> str:
    return "[bold green]identical[/]" if same else "[bold red]DIFFERENT[/]"


def _own_home(prefix: str) -> tuple[Settings, Path, Path]:
    """A fresh TIDAL_HOME for the demo's cluster, away from the user's cluster (its state, tokens and port);
    with the training job's working directory and the reference run's in it."""
    from tidal.config import load_settings

    home = demo_dir(load_settings().home, prefix)
    os.environ["TIDAL_HOME"] = str(home)
    for var in ("TIDAL_URL", "TIDAL_TOKEN", "TIDAL_DATABASE_URL", "TIDAL_CHECKPOINT_STORE"):
        os.environ.pop(var, None)
    workdir, refdir = home / "work", home / "reference"
    workdir.mkdir()
    refdir.mkdir()
    return load_settings(), workdir, refdir


@contextlib.contextmanager
def _cluster_beside(reference: subprocess.Popen[bytes], settings: Settings, devices_per_node: int,
                    keep: bool, urls: list[str] | None = None) -> Iterator[Client]:
    """The demo's local cluster of 2 nodes, started while ``reference`` (the uninterrupted run, in a session
    of its own) goes on. After: the reference's processes killed, the cluster stopped, and its state
    removed unless ``keep``."""
    from tidal.control.localcluster import down, up  # the launcher of `tidal up`: heavy, needed here only

    try:
        state, _ = up(settings, nodes=2, devices_per_node=devices_per_node, lease_s=5.0)
        if urls is not None:
            urls.append(state.url)
        yield Client()
    finally:
        with contextlib.suppress(ProcessLookupError):  # torchrun and its workers too
            os.killpg(reference.pid, signal.SIGKILL)
        reference.wait()
        down(settings)
        if not keep:
            shutil.rmtree(settings.home, ignore_errors=True)


class _Story:
    """Prints numbered steps with the time since the demo started."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.n = 0

    def say(self, text: str) -> None:
        self.n += 1
        console.print(f"[dim]{time.monotonic() - self.t0:6.1f}s[/] {self.n:2d}. {text}", highlight=False)


@dataclass
class _Stage:
    """Where the cluster demo's story plays: a client of its control plane, its nodes (and their hosts'
    addresses, where they are hosts of their own), the job's working directory, what to say of it."""

    api: Client
    nodes: list[str]
    workdir: Path
    addr: dict[str, str]
    opening: str
    store: str | None
    dashboard: str | None = None  # where the dashboard is, and how to log in


@contextlib.contextmanager
def _hosts_beside(reference: subprocess.Popen[bytes], settings: Settings) -> Iterator[_Stage]:
    """The demo's cluster on test hosts: network namespaces on a private bridge of this machine, with the
    control plane (`tidal server --tls auto`) on host cp, PostgreSQL on db, SeaweedFS (the S3 checkpoint
    store) on s3, and an agent joined on each of node1..node3. The job's working directory is on the
    directory every host sees at the same path. All of it is removed after, the reference's processes
    killed."""
    # The test hosts' builders: what `tidal demo --hosts` shows is exactly what the multi-host tests run on.
    from tidal.testing.hostcluster import HostCluster
    from tidal.testing.hosts import TestNet

    nodes = ["node1", "node2", "node3"]
    try:
        with TestNet(names=["cp", "db", "s3", *nodes], name_prefix="demo") as net:
            cluster = HostCluster(net, nodes=nodes, lease=10)
            workdir = net.shared / "work"
            workdir.mkdir()
            os.environ.update(TIDAL_URL=cluster.url, TIDAL_TOKEN=cluster.user_token, TIDAL_CA=str(cluster.ca))
            addr = {n: net[n].addr for n in nodes}
            yield _Stage(Client(), nodes, workdir, addr,
                         f"Hosts up: control plane on cp ({cluster.server_host.addr}, TLS), PostgreSQL on db "
                         f"({net['db'].addr}), SeaweedFS (S3) on s3 ({net['s3'].addr}); agents joined on "
                         + ", ".join(f"{n} ({a})" for n, a in addr.items()),
                         f"{cluster.store_url} (SeaweedFS on host s3)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(reference.pid, signal.SIGKILL)
        reference.wait()
        shutil.rmtree(settings.home, ignore_errors=True)


@contextlib.contextmanager
def _local_beside(reference: subprocess.Popen[bytes], settings: Settings, workdir: Path,
                  keep: bool) -> Iterator[_Stage]:
    urls: list[str] = []
    with _cluster_beside(reference, settings, 1, keep, urls) as api:
        yield _Stage(api, ["node-1", "node-2"], workdir, {},
                     "Cluster up: control plane and agents node-1, node-2 (an uninterrupted reference run of the "
                     "same training script goes on in the background)", None,
                     f"{urls[0]}/ui (log in with the token in {settings.home / 'tokens' / 'user.token'})")


def run_cluster_demo(steps: int = 300, keep: bool = False, hosts: bool = False, keep_for: float = 0.0) -> bool:
    """Preemption by a premium job, resume on another node, migration, identical output; ``hosts``: on 3
    test hosts with PostgreSQL and S3, the job moving from host to host. ``keep_for``: seconds the local
    cluster stays up after the story, for its dashboard."""
    from tidal.cli import jobenv  # here: `tidal --help` imports this module, and needs none of the core

    script = example_script("train.py")
    settings, workdir, refdir = _own_home("demo-hosts-" if hosts else "demo-cluster-")
    train = [sys.executable, str(script), "--steps", str(steps), "--step-time", "0.06"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    job_env = {**jobenv.passed(env), "PYTHONUNBUFFERED": "1"}  # what `tidal submit` would send
    story = _Story()
    if hosts:
        console.print("[bold]Tidal demo: hosts[/] — 3 node hosts with 1 device each, and hosts for the control "
                      "plane, PostgreSQL and S3 (network namespaces of this machine on a private network)")
    else:
        console.print(f"[bold]Tidal demo[/] — a local cluster of 2 nodes with 1 device each, state in "
                      f"{settings.home}")
    reference = subprocess.Popen(train, cwd=refdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    stage = _hosts_beside(reference, settings) if hosts else _local_beside(reference, settings, workdir, keep)
    with stage as st:
        api = st.api
        story.say(st.opening)
        if st.dashboard:
            console.print(f"Dashboard: [bold]{st.dashboard}[/]", highlight=False)

        def submit(name: str, tier: str, argv: list[str]) -> str:
            job = api.post("/v1/jobs", json={"name": name, "tier": tier, "command": argv,
                                             "workdir": str(st.workdir), "env": job_env})
            return str(job["id"])

        def job(jid: str) -> dict[str, Any]:
            return dict(api.get(f"/v1/jobs/{jid}"))

        def at(node: str) -> str:
            return f"{node} ({st.addr[node]})" if node in st.addr else node

        def where(jid: str) -> str:
            j = job(jid)
            return ", ".join(f"{at(p['node'])}, pid {p['pid']}" for p in j["placement"]) or "-"

        def running_on(jid: str, node: str | None = None) -> bool:
            j = job(jid)
            return j["state"] == "running" and bool(j["placement"]) and all(
                p["pid"] for p in j["placement"]) and (node is None or j["placement"][0]["node"] == node)

        def log(jid: str) -> bytes:
            return bytes(api.request("GET", f"/v1/jobs/{jid}/logs", params={"rank": 0}).content)

        basic = submit("train", "basic", train)
        until("the basic job to run", lambda: running_on(basic))
        story.say(f"Basic job [bold]{basic}[/] (train.py, {steps} steps) runs on {where(basic)}")
        until("the basic job's step 20", lambda: b"\nstep 20 " in log(basic))
        # Every other device gets a standard job, so that the premium job finds none free.
        others = [submit("eval", "standard", ["sh", "-c", "for i in $(seq 1 12); do echo eval $i; sleep 0.5; done"])
                  for _ in st.nodes[1:]]
        until("the standard jobs to run", lambda: all(running_on(o) for o in others))
        story.say(f"Standard job{'s' if len(others) > 1 else ''} "
                  + "; ".join(f"[bold]{o}[/] on {where(o)}" for o in others)
                  + f" take{'' if len(others) > 1 else 's'} the other device{'s' if len(others) > 1 else ''}")
        premium = submit("urgent", "premium", ["sh", "-c", "for i in $(seq 1 24); do echo urgent $i; sleep 0.5; done"])
        story.say(f"Premium job [bold]{premium}[/] arrives: no device is free")
        until("the basic job to be preempted", lambda: job(basic)["state"] in ("preempted", "restoring"))
        ck = job(basic)["checkpoints"]
        story.say(f"The scheduler preempts the basic job: checkpoint {ck[-1]['id']} "
                  f"({ck[-1]['bytes'] / 2**20:.0f} MiB{' to ' + st.store if st.store else ''}), devices released")
        until("the premium job to run", lambda: running_on(premium))
        story.say(f"Premium job runs on {where(premium)}")
        until("the standard jobs to finish", lambda: all(job(o)["state"] == "succeeded" for o in others))
        until("the basic job to resume", lambda: running_on(basic))
        story.say(f"The standard job{'s are' if len(others) > 1 else ' is'} done; the basic job resumes where there "
                  f"is room, from its checkpoint: {where(basic)}")
        until("the premium job to finish", lambda: job(premium)["state"] == "succeeded", timeout=180)
        here = job(basic)["placement"][0]["node"]
        there = st.nodes[(st.nodes.index(here) + 1) % len(st.nodes)]
        story.say(f"The premium job is done; we migrate the basic job from {at(here)} to {at(there)}")
        api.post(f"/v1/jobs/{basic}/migrate", json={"to": there})
        until("the basic job to run on the target", lambda: running_on(basic, there))
        story.say(f"Basic job runs on {where(basic)}")
        final = until("the basic job to finish", lambda: (j := job(basic))["terminal"] and j, timeout=300)
        ref_out, _ = reference.communicate(timeout=300)
        out = log(basic)
        same_log = out == ref_out and reference.returncode == 0
        same_params = (st.workdir / "params.bin").read_bytes() == (refdir / "params.bin").read_bytes()
        story.say(f"Basic job {final['state']}")
        from rich.table import Table

        table = Table(title=f"Basic job {basic}: what happened")
        for col in ("time", "event", "node", "cause"):
            table.add_column(col)
        t0 = final["events"][0]["time"]
        for e in final["events"]:
            table.add_row(f"{e['time'] - t0:6.1f}s", e["kind"], at(e["node"]) if e["node"] else "", e["cause"] or "")
        console.print(table)
        console.print(f"Checkpoints: {len(final['checkpoints'])}; restarts: {final['restarts']}")
        console.print(f"Per-step output vs the uninterrupted run: {_verdict(same_log)} ({len(out.splitlines())} "
                      f"lines); final parameters: {_verdict(same_params)}")
        if keep_for > 0 and st.dashboard:
            console.print(f"The cluster stays up for {keep_for:.0f} s: dashboard at [bold]{st.dashboard}[/]",
                          highlight=False)
            time.sleep(keep_for)  # the feature itself: the cluster stays reachable this long
        return same_log and same_params and final["state"] == "succeeded"


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def run_distributed_demo(steps: int = 150, keep: bool = False) -> bool:
    """A DDP job of 4 ranks over two nodes: resized, one rank moved, grown back; identical to torchrun."""
    from tidal.cli import jobenv

    script = example_script("ddp_train.py")
    settings, workdir, refdir = _own_home("demo-ddp-")
    args = [str(script), "--steps", str(steps), "--step-time", "0.05", "--collectives"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    job_env = {**jobenv.passed(env), "PYTHONUNBUFFERED": "1"}  # what `tidal submit` would send
    story = _Story()
    console.print(f"[bold]Tidal demo: distributed[/] — 2 nodes with 2 devices each, state in {settings.home}")
    reference = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), "--log-dir", str(refdir / "logs"), "--redirects", "3", *args],
        cwd=refdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    with _cluster_beside(reference, settings, 2, keep) as api:
        story.say("Cluster up (plain `torchrun --nproc-per-node 4` of the same script runs in the background)")
        jid = str(api.post("/v1/jobs", json={"name": "ddp", "command": [sys.executable, *args], "ranks": 4,
                                             "min_devices": 1, "workdir": str(workdir), "env": job_env})["id"])

        def job() -> dict[str, Any]:
            return dict(api.get(f"/v1/jobs/{jid}"))

        def stable() -> dict[str, Any] | None:
            j = job()
            return j if j["state"] == "running" and not j["busy"] and all(p["pid"] for p in j["placement"]) else None

        def where() -> str:
            return ", ".join(f"r{p['rank']}→{p['node']}:{p['device']}" for p in job()["placement"])

        def steps_done() -> int:
            text = api.request("GET", f"/v1/jobs/{jid}/logs", params={"rank": 0}).text
            return text.count("\nrank 0 step")

        def act(path: str, body: dict[str, Any], what: str) -> None:
            before = job()["attempt"]
            api.post(f"/v1/jobs/{jid}/{path}", json=body)
            until(what, lambda: (j := stable()) and j["attempt"] > before, timeout=180)
            n = steps_done()
            until("more steps", lambda: steps_done() >= n + 3, timeout=120)

        until("the job to run", stable)
        story.say(f"DDP job [bold]{jid}[/] of 4 ranks (gloo) runs on two nodes: {where()}")
        until("its first steps", lambda: steps_done() >= 5)
        act("resize", {"devices": 2}, "the resize")
        story.say(f"Resized to 2 devices (2 ranks time-sliced on each; consistent cut, checkpoint, restore): "
                  f"{where()}")
        act("migrate", {"rank": 3, "to": "node-2"}, "the move")
        story.say(f"Rank 3 alone moved to node-2: {where()}")
        act("resize", {"devices": 4}, "the resize")
        story.say(f"Grown back to 4 devices: {where()}")
        final = until("the job to finish", lambda: (j := job())["terminal"] and j, timeout=300)
        reference.wait(timeout=300)
        same = final["state"] == "succeeded" and reference.returncode == 0
        for r in range(4):
            mine = [ln for ln in api.request("GET", f"/v1/jobs/{jid}/logs", params={"rank": r}).text.splitlines()
                    if ln.startswith("rank ")]
            (ref_log,) = (refdir / "logs").glob(f"*/attempt_0/{r}/stdout.log")
            theirs = [ln for ln in ref_log.read_text().splitlines() if ln.startswith("rank ")]
            same = same and mine == theirs
        same_params = (workdir / "params.bin").read_bytes() == (refdir / "params.bin").read_bytes()
        story.say(f"Job {final['state']} after {len(final['checkpoints'])} checkpoints at consistent cuts")
        console.print(f"Every rank's per-step output vs plain torchrun: {_verdict(same)}; final parameters: "
                      f"{_verdict(same_params)}")
        return same and same_params


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        mechanism: bool = typer.Option(False, "--mechanism", help="the checkpoint mechanism alone, no cluster"),
        distributed: bool = typer.Option(False, "--distributed",
                                         help="a DDP job resized and moved rank by rank (needs torch)"),
        steps: int = typer.Option(None, help="training steps of the demo job"),
        hosts: bool = typer.Option(False, "--hosts",
                                   help="the story on 3 test hosts (network namespaces of this machine) with the "
                                        "control plane on PostgreSQL and checkpoints in S3 (SeaweedFS)"),
        keep: bool = typer.Option(False, help="keep the demo's state directory (not with --hosts: the hosts and "
                                              "all on them are removed)"),
        keep_for: float = typer.Option(0.0, "--keep-for", min=0, max=24 * 3600, metavar="SECONDS",
                                       help="leave the first story's cluster up this long after the story, to "
                                            "look at it in its dashboard (the address is printed)"),
    ) -> None:
        """A basic job preempted by a premium one, resumed on the other node, migrated, finishing identically
        (--distributed: a 4-rank DDP job resized and moved, identical to torchrun; --hosts: the story across
        test hosts, with PostgreSQL and S3)."""
        if mechanism:
            ok = _mechanism_demo(steps or 60, keep)
        elif distributed:
            ok = run_distributed_demo(steps or 150, keep)
        else:
            ok = run_cluster_demo(steps or 300, keep, hosts=hosts, keep_for=keep_for)
        if not ok:
            raise typer.Exit(1)
