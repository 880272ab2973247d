"""The agent process: ``python -m tidal.agent --name node-1 --server URL --token-file F --root DIR``.

It must be a child subreaper (restored ranks are re-parented to it), and it is the lifeline of its ranks:
when it dies, they die (the rank's init watches it), so a node's jobs are never run twice.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import httpx

from tidal.agent.client import ControlClient, Refused
from tidal.agent.devices import CpuQuota, cpu_sets
from tidal.agent.executor import Executor
from tidal.agent.fencing import reap_leftovers
from tidal.config import load_settings
from tidal.core import limits, protocol
from tidal.errors import LeaseLost, ProtocolMismatch, ValidationError
from tidal.mechanisms.criu.discard import wait_discarded
from tidal.mechanisms.criu.rank import NodeRoot, become_subreaper
from tidal.mechanisms.storage import open_store

log = logging.getLogger("tidal.agent")


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.name
        self.agent_id = uuid.uuid4().hex[:12]
        token = Path(args.token_file).read_text().strip()
        self.client = ControlClient(args.server, token, self.name)
        self.cpus = cpu_sets(args.devices)
        self.hello()  # a name, region or cluster the control plane would refuse is an error now
        settings = load_settings()
        self.store = open_store(settings)
        self.node = NodeRoot.of_agent(self.name, Path(args.root))
        self.key = self.node.name
        self.registered = threading.Event()
        quota = CpuQuota(self.key, args.devices)
        self.executor = Executor(self.client, self.node, self.store, self.agent_id, self.lease_lost,
                                 quota if quota.enabled else None)
        self.lease_s = 5.0

    def hello(self) -> protocol.Register:
        """This node's registration."""
        return protocol.decode(protocol.Register, {
            "agent_id": self.agent_id, "name": self.name, "region": self.args.region, "cluster": self.args.cluster,
            "devices": self.args.devices, "cpus": self.cpus}, "registration")

    def register(self) -> None:
        while True:
            try:
                r = self.client.send("/v1/agent/register", self.hello())
                self.lease_s = float(r["lease_s"])
                self.registered.set()
                log.info("registered %s as agent %s (lease %.1fs)", self.name, self.agent_id, self.lease_s)
                return
            except ProtocolMismatch as exc:
                # Nothing works until one side is upgraded: say so, and try again now and then.
                log.error("register: %s", exc)
                time.sleep(5)
            except Refused as exc:
                # Another agent's lease on this node has not expired yet: wait it out.
                log.info("register: %s", exc)
                time.sleep(0.5)

    def lease_lost(self) -> None:
        if not self.registered.is_set():
            return
        self.registered.clear()
        log.warning("lease lost: fencing every rank and registering again")
        self.executor.fence()
        self.agent_id = uuid.uuid4().hex[:12]
        self.executor.agent_id = self.executor.outbox.agent_id = self.agent_id
        self.register()

    def heartbeats(self) -> None:
        while True:
            self.registered.wait()
            try:
                self.client.send(f"/v1/agent/{self.name}/heartbeat",
                                 protocol.Heartbeat(agent_id=self.agent_id, jobs=self.executor.progress()))
            except LeaseLost:
                self.lease_lost()
            except ProtocolMismatch as exc:
                log.error("heartbeat: %s", exc)
            except Exception as exc:
                log.debug("heartbeat: %s", exc)
            time.sleep(self.lease_s / 5)

    def logs(self) -> None:
        while True:
            self.registered.wait()
            try:
                self.executor.ship_all()
            except LeaseLost:
                self.lease_lost()
            time.sleep(0.2)

    def poll(self) -> None:
        while True:
            self.registered.wait()
            try:
                actions = self.client.call("GET", f"/v1/agent/{self.name}/actions",
                                           params={"agent_id": self.agent_id, "wait": 10})
            except LeaseLost:
                self.lease_lost()
                continue
            except Exception as exc:
                log.debug("poll: %s", exc)
                time.sleep(0.2)
                continue
            if not isinstance(actions, list):
                log.error("poll: the control plane sent %s, not a list of actions", type(actions).__name__)
                time.sleep(1)
                continue
            for a in actions:
                self.executor.submit(a)

    def run(self) -> None:
        self.register()
        # Only now that this process holds the node's lease: whatever an earlier agent left is fenced.
        reap_leftovers(self.key)
        self.node.clear_staging()  # and what it kept in memory for them
        for target in (self.heartbeats, self.logs):
            threading.Thread(target=target, daemon=True, name=f"tidal-{target.__name__}").start()
        self.poll()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="tidal-agent")
    ap.add_argument("--name", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--root", required=True, help="the node root: this node's private state")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--region", default="local")
    ap.add_argument("--cluster", default="local")
    args = ap.parse_args(argv)
    if not 1 <= args.devices <= limits.MAX_DEVICES_PER_NODE:  # the control plane would refuse the node
        ap.error(f"--devices: from 1 to {limits.MAX_DEVICES_PER_NODE}")
    os.umask(0o077)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {args.name}: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    become_subreaper()
    try:
        agent = Agent(args)
    except ValidationError as exc:
        ap.error(str(exc))

    def leave() -> None:
        # tidal down: stop the ranks, give the node back (its jobs are requeued at once), exit. Were we
        # killed instead, the ranks' inits would see their lifeline close and take the ranks down.
        agent.executor.fence()
        # os._exit does not wait for the threads removing images in the background: what they and the
        # jobs kept in memory-backed /dev/shm goes now.
        wait_discarded(timeout=10)
        agent.node.clear_staging()
        with contextlib.suppress(Exception), httpx.Client(base_url=args.server, timeout=5) as http:
            http.post(f"/v1/agent/{agent.name}/leave", json=protocol.encode(protocol.Leave(agent_id=agent.agent_id)),
                      headers=dict(agent.client.http.headers))
        os._exit(0)

    # Not in the handler itself: the main thread may be inside a request on the shared client.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=leave, daemon=True).start())
    agent.run()


if __name__ == "__main__":
    main()
