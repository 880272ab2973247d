"""The agent process: ``python -m tidal.agent --name node-1 --server URL --token-file F --root DIR`` (as
``tidal up`` starts it, with the cluster credential), or with ``--join-token`` (``TIDAL_JOIN_TOKEN``) for a
node that joins a remote control plane (``tidal agent``): the join token is exchanged once for the node's
own credential, kept in the node root (:mod:`tidal.agent.credential`). ``--ca``/``--ca-fingerprint`` say
which certificate of the control plane to trust (:mod:`tidal.tls`), ``--advertise-addr`` where the other
nodes reach this one (stored with the node). ``--devices N`` offers N CPU devices (shares of the machine's CPUs),
``--devices auto`` one device per NVIDIA GPU found through NVML (:mod:`tidal.agent.gpus`; no GPU is an error,
never a fall-back to CPU devices).

A credential refused (401: revoked, or the node removed) stops the agent: it kills its ranks and exits
with status 78 (a service manager should not restart it: ``RestartPreventExitStatus=78``). So does a
control plane whose certificate is not the trusted one.

It must be a child subreaper (restored ranks are re-parented to it), and it is the lifeline of its ranks:
when it dies, they die (the rank's init watches it), so a node's jobs are never run twice.

Nor when it lives on but cannot reach the control plane (a network partition): the control plane then lets
the node's lease run out and requeues its jobs, to be restored elsewhere from their last checkpoints. So
the agent fences itself first (:mod:`tidal.agent.lease`): a watchdog thread kills every rank once the lease
can no longer be assumed held (``max(0.5 s, lease / 4)`` before it runs out, counted from when the last
acknowledged heartbeat was *sent*), and the agent keeps trying to reach the control plane, where it
registers again as a new agent. An agent cannot tell a partition from a control plane that is down: a
control-plane outage longer than three quarters of the lease fences every job too (each resumes from its
last checkpoint), so the lease (``tidal server --lease``) should outlast a control-plane restart.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import NoReturn

import httpx

from tidal.agent import credential
from tidal.agent.client import ControlClient, Refused, Unreachable, Untrusted
from tidal.agent.devices import CpuQuota, cpu_sets
from tidal.agent.executor import Executor
from tidal.agent.fencing import reap_leftovers
from tidal.agent.gpus import offer
from tidal.agent.lease import WATCH_INTERVAL_S, LeaseClock, fence_margin, request_timeout
from tidal.config import load_settings
from tidal.core import protocol
from tidal.core.topology import devices_option
from tidal.errors import ConfigError, LeaseLost, ProtocolMismatch, TidalError, ValidationError
from tidal.mechanisms.criu.discard import wait_discarded
from tidal.mechanisms.criu.rank import NodeRoot, become_subreaper
from tidal.mechanisms.storage import CheckpointStore, store_options
from tidal.tls import client_context

log = logging.getLogger("tidal.agent")


#: The agent's exit status when it cannot act for its node: its credential was refused or revoked, or the
#: control plane's certificate is not the trusted one (EX_CONFIG: restarting it would not help).
EXIT_REFUSED = 78

#: How long a registration may take: it is not pressed for time (no lease is held meanwhile), and a
#: control plane busy starting up should not be sent the same registration again and again.
REGISTER_TIMEOUT_S = 10.0
#: How often the heartbeat measures the node's staging areas (a walk of their files): not at every beat.
NODE_FIGURES_EVERY_S = 10.0


class Stop(TidalError):
    """The agent cannot go on (its credential refused, the control plane not trusted): say why and exit."""


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = args.name
        self.agent_id = uuid.uuid4().hex[:12]
        self.root = Path(args.root)
        self.verify = client_context(ca=args.ca, pin=args.ca_fingerprint) or True
        # `--devices auto`: one device per NVIDIA GPU (a ConfigError where NVML finds none); a number: CPU devices.
        self.devices, self.gpus = offer(args.devices)
        if self.gpus:
            log.info("%d GPU device(s): %s", self.devices,
                     "; ".join(f"{g.index}: {g.model} ({g.memory_bytes / (1 << 30):.1f} GiB, {g.uuid})"
                               for g in self.gpus))
        self.cpus = cpu_sets(self.devices)
        self.hello()  # a name, region, cluster or address the control plane would refuse is an error now
        self.node = NodeRoot.of_agent(self.name, self.root)
        self.key = self.node.name
        self.token, self.token_from = self.credential()
        self.client = ControlClient(args.server, self.token, self.name, self.verify)
        # Whether this agent holds the node's lease (set and cleared with the lease clock's transitions):
        # the threads that talk to the control plane wait for it.
        self.registered = threading.Event()
        self.lease = LeaseClock()
        self._executor: Executor | None = None  # from the first registration, which names the store
        self.store_url: str | None = None
        self.stopping = threading.Lock()

    def credential(self) -> tuple[str, str]:
        """The credential to act for the node with, and where it came from: ``--token-file`` (``tidal up``:
        the cluster's), else the node's own kept in the node root, else the one a join token is exchanged for."""
        if self.args.token_file:
            return Path(self.args.token_file).read_text().strip(), "file"
        token = credential.stored(self.root)
        if token is not None:
            return token, "stored"
        if not self.args.join_token:
            raise Stop(f"node {self.name} has no credential yet ({credential.path(self.root)})",
                       hint=f"give a join token: `tidal token create --node {self.name}` on the control plane "
                            "makes one; pass it with --join-token (or TIDAL_JOIN_TOKEN)")
        return self.join(), "joined"

    def join(self) -> str:
        try:
            token = credential.join(self.args.server, self.args.join_token, self.name, self.verify)
        except Refused as exc:
            raise Stop(exc.message, hint=exc.hint) from None  # "the control plane refused POST /v1/agent/join: ..."
        where = credential.store(self.root, token)
        log.info("joined: node %s's own credential is kept in %s", self.name, where)
        return token

    def hello(self) -> protocol.Register:
        """This node's registration."""
        return protocol.decode(protocol.Register, {
            "agent_id": self.agent_id, "name": self.name, "region": self.args.region, "cluster": self.args.cluster,
            "devices": self.devices, "cpus": self.cpus, "advertise_addr": self.args.advertise_addr,
            **({"gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_bytes": g.memory_bytes}
                         for g in self.gpus]} if self.gpus else {})},
            "registration")

    def register(self) -> None:
        """Take the node's lease as ``agent_id``, trying until the control plane grants it."""
        while True:
            # Each try on its own (no retries inside the call): the lease runs from when the one that
            # succeeded was sent.
            attempt = self.lease.attempt()
            try:
                r = self.client.send("/v1/agent/register", self.hello(), retry=False, timeout=REGISTER_TIMEOUT_S)
                lease_s = float(r["lease_s"])
            except Unreachable as exc:
                log.debug("register: %s", exc)
                time.sleep(0.5)
                continue
            except ProtocolMismatch as exc:
                # Nothing works until one side is upgraded: say so, and try again now and then.
                log.error("register: %s", exc)
                time.sleep(5)
            except Refused as exc:
                status = exc.fields.get("status")
                if status == 401 and self.token_from == "stored" and self.args.join_token:
                    # The credential kept from an earlier join was revoked: join again with the token given.
                    log.warning("register: %s; joining again with the join token given", exc.message)
                    self.token, self.token_from = self.join(), "joined"
                    self.client.http.headers["Authorization"] = f"Bearer {self.token}"
                    continue
                if status in (401, 403):
                    raise Stop(exc.message, hint=exc.hint) from None
                if isinstance(status, int) and status >= 500:  # the control plane is not ready: try again
                    log.debug("register: %s", exc)
                else:  # another agent's lease on this node has not expired yet: wait it out
                    log.info("register: %s", exc)
                time.sleep(0.5)
                continue
            self.lease.held(self.agent_id, attempt, lease_s)
            self.use_store(r.get("store"))
            self.executor.hold(self.agent_id)
            self.registered.set()
            log.info("registered %s as agent %s (lease %gs)", self.name, self.agent_id, lease_s)
            return

    def use_store(self, offered: str | None) -> None:
        """The checkpoint store: this node's own setting where it has one (TIDAL_CHECKPOINT_STORE), else the
        one the control plane tells every node, else TIDAL_HOME/checkpoints. Chosen at the first
        registration."""
        settings = load_settings()
        url = settings.checkpoint_store or offered or settings.store_url
        if self.store_url is not None:
            if url != self.store_url:
                log.warning("the control plane now names checkpoint store %s; this agent keeps %s until it "
                            "restarts", offered, self.store_url)
            return
        if settings.checkpoint_store and offered and offered != settings.checkpoint_store:
            log.warning("checkpoint store: this node's TIDAL_CHECKPOINT_STORE %s, not the control plane's %s",
                        settings.checkpoint_store, offered)
        store = CheckpointStore(url, workers=settings.store_concurrency, **store_options(settings, url))
        self.store_url = url
        log.info("checkpoint store: %s", url)
        quota = CpuQuota(self.key, self.devices, cpus=self.cpus)
        self._executor = Executor(self.client, self.node, store, self.agent_id, self.lease_lost,
                                  quota if quota.enabled else None, gpus=self.gpus)

    @property
    def executor(self) -> Executor:
        assert self._executor is not None, "the executor starts at the first registration"
        return self._executor

    def refused(self, exc: TidalError) -> None:
        """The control plane refused this agent's credential (revoked, or the node removed): its jobs will be
        requeued when the lease runs out, so the ranks must not go on here. Kill them and exit."""
        if not self.stopping.acquire(blocking=False):
            return

        def stop() -> None:
            log.error("%s: node %s's credential is refused; stopping every rank and exiting", exc.message,
                      self.name)
            if self._executor is not None:
                self._executor.fence()
            os._exit(EXIT_REFUSED)

        threading.Thread(target=stop, name="tidal-refused").start()

    def lease_lost(self, agent_id: str) -> None:
        """The control plane answered that ``agent_id`` does not hold the node's lease. If that is still this
        agent's lease (not one it already gave up), fence and register again."""
        if not self.lease.lose(agent_id):
            return
        self.registered.clear()
        log.warning("lease lost: fencing every rank and registering again")
        self.executor.fence()
        self.rejoin()

    def expired(self, agent_id: str) -> None:
        """The watchdog found ``agent_id``'s lease past its deadline: the control plane may requeue the
        node's jobs soon. Fence, then register again once the control plane answers."""
        self.registered.clear()
        silent = self.lease.since_acknowledged()
        t0 = time.monotonic()
        self.executor.fence()
        log.warning("cannot renew node %s's lease for %.1fs (the last acknowledged heartbeat was sent then, none "
                    "since; the lease lasts %gs): fenced its ranks in %.2fs, at least %gs before the control plane "
                    "may requeue their jobs; they will be restored elsewhere from their last checkpoint. "
                    "Registering again once the control plane answers", self.name, silent, self.lease.lease_s,
                    time.monotonic() - t0, fence_margin(self.lease.lease_s))
        self.rejoin(give_back=agent_id)

    def rejoin(self, give_back: str | None = None) -> None:
        """After a fence: register again as a new agent (the old one's lease must run out first, unless it
        is given back: ``give_back``, the old agent id)."""
        self.agent_id = uuid.uuid4().hex[:12]
        self.executor.agent_id = self.executor.outbox.agent_id = self.agent_id
        try:
            if give_back is not None:
                self.give_back(give_back)
            self.register()
        except (Stop, Untrusted) as exc:
            self.refused(exc)

    def give_back(self, agent_id: str) -> None:
        """After a fence of its own: tell the control plane, once it answers, that ``agent_id``'s ranks are
        gone, so that it requeues the node's jobs now rather than when the lease it counts runs out (after
        a restart of the control plane, a whole fresh lease). Nothing to do when it has expired the lease."""
        while True:
            try:
                self.client.send(f"/v1/agent/{self.name}/leave", protocol.Leave(agent_id=agent_id), retry=False,
                                 timeout=REGISTER_TIMEOUT_S)
                log.info("node %s given back by agent %s: its jobs are requeued now", self.name, agent_id)
                return
            except Unreachable as exc:
                log.debug("give back: %s", exc)
            except Refused as exc:
                status = exc.fields.get("status")
                if not (isinstance(status, int) and status >= 500):
                    return  # unknown node, or a refused credential (the agent stops)
                log.debug("give back: %s", exc)
            except (LeaseLost, ProtocolMismatch):
                return  # already expired; or left to registration, which says why it cannot go on
            time.sleep(0.5)

    def watchdog(self) -> None:
        """Fence when the lease can no longer be assumed held. Its own thread: a heartbeat can hang for as
        long as its timeout, and the deadline must not wait for it."""
        while True:
            self.registered.wait()
            left = self.lease.remaining()
            if left is None or left > 0:  # None: between a fence and the registration.clear() that follows
                time.sleep(WATCH_INTERVAL_S if left is None else min(left, WATCH_INTERVAL_S))
                continue
            lost = self.lease.expire()
            if lost is not None:  # else a renewal came just now, or lease_lost() won
                self.expired(lost)

    def heartbeats(self) -> None:
        """Renew the lease every fifth of it, one heartbeat at a time (none piles up behind a slow one):
        each gives up after a quarter of the lease, and a failed one is tried again soon, so that the lease
        is renewed if the control plane answers at all before the watchdog's deadline."""
        figures: dict[str, float] = {}
        measured = -NODE_FIGURES_EVERY_S
        while True:
            self.registered.wait()
            agent_id, lease_s = self.agent_id, self.lease.lease_s
            t0 = time.monotonic()
            pause = lease_s / 5
            try:
                if t0 - measured >= NODE_FIGURES_EVERY_S:
                    figures, measured = self.executor.node_figures(), t0
                beat = protocol.Heartbeat(agent_id=agent_id, jobs=self.executor.progress(), node=figures)
                attempt = self.lease.attempt()
                r = self.client.send(f"/v1/agent/{self.name}/heartbeat", beat, retry=False,
                                     timeout=request_timeout(lease_s))
                self.lease.renewed(agent_id, attempt, float(r["lease_s"]))
            except LeaseLost:
                self.lease_lost(agent_id)
                continue
            except ProtocolMismatch as exc:
                log.error("heartbeat: %s", exc)
            except Exception as exc:
                log.debug("heartbeat: %s", exc)
                pause = lease_s / 20
            time.sleep(max(0.0, pause - (time.monotonic() - t0)))

    def logs(self) -> None:
        while True:
            self.registered.wait()
            agent_id = self.agent_id
            try:
                self.executor.ship_all()
            except LeaseLost:
                self.lease_lost(agent_id)
            time.sleep(0.2)

    def poll(self) -> None:
        while True:
            self.registered.wait()
            agent_id = self.agent_id  # the lease the actions come under
            try:
                actions = self.client.call("GET", f"/v1/agent/{self.name}/actions",
                                           params={"agent_id": agent_id, "wait": 10})
            except LeaseLost:
                self.lease_lost(agent_id)
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
                self.executor.submit(a, agent_id)

    def run(self) -> None:
        self.register()
        self.client.on_unauthorized = self.refused
        # The lease is kept (or the agent fences itself) from now on, however long the clean-up below takes.
        for target in (self.heartbeats, self.watchdog):
            threading.Thread(target=target, daemon=True, name=f"tidal-{target.__name__}").start()
        # Only now that this process holds the node's lease: whatever an earlier agent left is fenced.
        reap_leftovers(self.key)
        self.node.clear_staging()  # and what it kept in memory for them
        threading.Thread(target=self.logs, daemon=True, name="tidal-logs").start()
        self.poll()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="tidal-agent")
    ap.add_argument("--name", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--token-file", help="a credential to act for the node with (`tidal up`: the cluster's)")
    ap.add_argument("--join-token", default=os.environ.get("TIDAL_JOIN_TOKEN") or None,
                    help="exchanged once for the node's own credential, kept in the node root "
                         "(default TIDAL_JOIN_TOKEN)")
    ap.add_argument("--ca", help="trust only this CA (PEM) for the control plane's certificate")
    ap.add_argument("--ca-fingerprint", help="trust only the certificate of the control plane's chain with this "
                                             "SHA-256 fingerprint (as `tidal server` prints it)")
    ap.add_argument("--advertise-addr", help="the address other nodes reach this one at (stored with the node)")
    ap.add_argument("--root", required=True, help="the node root: this node's private state")
    ap.add_argument("--devices", default="1",
                    help="N: N CPU devices (shares of the CPUs); auto: one device per NVIDIA GPU (through NVML)")
    ap.add_argument("--region", default="local")
    ap.add_argument("--cluster", default="local")
    args = ap.parse_args(argv)
    os.environ.pop("TIDAL_JOIN_TOKEN", None)  # read: nothing this process starts (CRIU, the store) needs it
    try:  # a number the control plane would refuse is refused now
        args.devices = devices_option(args.devices)
    except ValidationError as exc:
        ap.error(exc.message)
    os.umask(0o077)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {args.name}: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    become_subreaper()
    try:
        agent = Agent(args)
    except ValidationError as exc:
        ap.error(str(exc))
    except (Stop, Untrusted, ConfigError) as exc:
        _exit_refused(exc)

    def leave() -> None:
        # tidal down: stop the ranks, give the node back (its jobs are requeued at once), exit. Were we
        # killed instead, the ranks' inits would see their lifeline close and take the ranks down.
        if agent._executor is not None:
            agent._executor.fence()
        # os._exit does not wait for the threads removing images in the background: what they and the
        # jobs kept in memory-backed /dev/shm goes now.
        wait_discarded(timeout=10)
        agent.node.clear_staging()
        with contextlib.suppress(Exception), \
                httpx.Client(base_url=args.server, timeout=5, verify=agent.verify) as http:
            http.post(f"/v1/agent/{agent.name}/leave", json=protocol.encode(protocol.Leave(agent_id=agent.agent_id)),
                      headers=dict(agent.client.http.headers))
        os._exit(0)

    # Not in the handler itself: the main thread may be inside a request on the shared client.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=leave, daemon=True).start())
    try:
        agent.run()
    except (Stop, Untrusted) as exc:
        _exit_refused(exc)


def _exit_refused(exc: TidalError) -> NoReturn:
    log.error("%s", exc.message)
    if exc.hint:
        log.error("hint: %s", exc.hint)
    sys.exit(EXIT_REFUSED)


if __name__ == "__main__":
    main()
