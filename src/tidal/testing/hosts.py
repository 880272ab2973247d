"""Test hosts: N machines on a private network, made of network namespaces on this one.

::

    from tidal.testing.hosts import TestNet, tcp_reachable

    with TestNet(n_hosts=3) as net:              # or TestNet(names=["cp", "db", "n1", "n2"])
        a, b = net.hosts[0], net.hosts[1]        # net["h1"] is net.hosts[1]
        srv = b.popen([sys.executable, "-m", "http.server", "8000", "--bind", b.addr])
        assert wait_until(lambda: tcp_reachable(a, b.addr, 8000), timeout=10, what="b's server")
        a.run(["curl", "-s", f"http://{b.addr}:8000/"])
        b.link_down()                            # b's cable pulled: it reaches nobody, nobody reaches it
        b.link_up()
        net.cap(a, b, "100mbit")                 # a <-> b at 100 Mbit/s each way (tc htb)
        b.cap("50mbit")                          # all of b's traffic, in and out
    # every namespace, link, qdisc, process and directory of the run is gone here

Each host is a network namespace with loopback up and one veth pair to a bridge, its "switch", in this
machine's own namespace. Hosts get ``198.18.K.10``, ``.11``, ... on ``198.18.K.0/24``, where K is the first
/24 of the benchmarking range no other run on the machine uses (0 when there is none); the bridge has
``198.18.K.1`` (:attr:`TestNet.gateway`), so the test process reaches every host directly, and hosts reach
it. No host has a default route and this machine does not forward, so nothing leaves the machine; while a
net exists, an "unreachable" route for 198.18.0.0/15 makes sure a packet for a host that is gone does not
either.

Processes on a host run through ``nsenter --net`` (:meth:`Host.popen`, :meth:`Host.run`): they see the
machine's file system, mounts and cgroups, and that host's network only. They also share the machine's
hostname: a program that finds its own address from its hostname finds the machine's, so give it the host's
address, or its interface, which is ``eth0`` on every host (``GLOO_SOCKET_IFNAME=eth0`` for gloo).
Python code in the test process runs on a host with :meth:`Host.call` (sockets made there stay on that
host). Every host sees the same files: :attr:`TestNet.shared` is the stand-in for NFS (mode 0755; give an
account a directory there with ``tidal.testing.owned_dir(net.shared / "job", "nobody")``), :attr:`Host.dir`
a directory for one host's private state (an agent's node root).

Latency: this kernel has no ``netem``; :class:`tidal.testing.relay.Relay` is a TCP relay that delays what
it forwards. Services on hosts: :class:`tidal.testing.postgres.PostgresServer` and
:class:`tidal.testing.seaweedfs.SeaweedFS` take ``host=``.

Cleanup: on leaving the ``with`` block (a test that fails included), callbacks given to
:meth:`TestNet.on_close` run (services stop cleanly), every process in the hosts' namespaces is ended
(SIGTERM, then SIGKILL), and the namespaces, links, qdiscs and directories are removed. A SIGTERM to the
test process is turned into ``KeyboardInterrupt`` while a net exists, so that this happens then too. If the test
process is killed outright, a watchdog process removes the run as soon as it sees its owner die, and
:func:`tidal.testing.hostsweep.sweep` (which the ``test_net`` fixture calls first) removes what any dead run
left. Names carry the run's tag (:mod:`tidal.testing.hostsweep`), so runs at the same time never collide.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

from tidal.errors import TidalError, ValidationError
from tidal.testing import hostsweep
from tidal.testing.netns import call_in, ip, netns_pids, nsenter_argv, tc, wait_entered
from tidal.testing.netns import tcp_reachable as _tcp_reachable

T = TypeVar("T")

#: Where test nets take their /24s: 198.18.K.0/24 for K in 0..255.
SUPERNET = "198.18.0.0/16"
FIRST_HOST = 10
#: The rate of the htb class that carries traffic no cap names (a device with any cap has one).
UNCAPPED = "10gbit"


class Host:
    """One test host: a network namespace with loopback and ``eth0`` (:attr:`addr`) up."""

    def __init__(self, net: TestNet, index: int, name: str, addr: str) -> None:
        self.net, self.index, self.name, self.addr = net, index, name, addr
        self.netns = hostsweep.netns_name(net.prefix, net.tag, name)
        self.port = hostsweep.port_name(net.tag, index)  # its end of the veth pair, on the bridge
        self.dir = net.dir / "hosts" / name
        self._cap: str | None = None
        self._pair_caps: dict[str, str] = {}  # peer address -> rate, from this host

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.addr}, netns={self.netns!r})"

    # processes

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on this host (for launchers that take a command line)."""
        return nsenter_argv(self.netns, argv)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on this host, in a session of its own, as :class:`subprocess.Popen` with
        ``kwargs``; it is on the host when this returns. The net ends it (and everything else on the host)
        when it closes."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.argv(argv), start_new_session=True, **kwargs)
        self.net._procs.append(proc)
        wait_entered(proc, self.netns)
        return proc

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float | None = 120,
            env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to its end; its output as text. With ``check``, a non-zero exit raises
        a :class:`TidalError` that shows both outputs."""
        p = subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                           input=input, start_new_session=True,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise TidalError(f"{argv} on {self.name} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def pids(self) -> list[int]:
        """Every process on this host."""
        return netns_pids(self.netns)

    # Python in this process, on this host

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run in a thread on this host; its result (or its exception). Sockets it makes stay on
        this host wherever they are used next."""
        return call_in(self.netns, fn)

    def connect(self, addr: str, port: int, timeout: float = 5.0) -> socket.socket:
        """A TCP connection from this host to ``addr:port``."""
        return self.call(lambda: socket.create_connection((addr, port), timeout=timeout))

    def listen(self, port: int = 0, backlog: int = 16) -> socket.socket:
        """A TCP socket listening on this host's address (``port`` 0: any free one, see ``getsockname``)."""
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.addr, port))
            s.listen(backlog)
            return s

        return self.call(make)

    def reachable(self, addr: str, port: int, timeout: float = 1.0) -> bool:
        """Whether this host can open a TCP connection to ``addr:port`` within ``timeout`` seconds."""
        return _tcp_reachable(self.netns, addr, port, timeout)

    # the link

    def link_down(self) -> None:
        """Pull this host's cable at the switch: its port goes down, so it reaches nobody and nobody reaches
        it; its own address and loopback still work, and its connections stay open (their packets are
        lost) until TCP gives up on them or the link comes back."""
        ip("link", "set", self.port, "down")

    def link_up(self) -> None:
        ip("link", "set", self.port, "up")

    @property
    def link_is_up(self) -> bool:
        return "UP" in json.loads(ip("-j", "link", "show", self.port).stdout)[0].get("flags", [])

    # bandwidth

    def cap(self, rate: str | None) -> None:
        """Cap all of this host's traffic at ``rate`` (a ``tc`` rate: "100mbit", "5mbps") in each direction,
        on top of any pair caps (:meth:`TestNet.cap`); ``None`` lifts it."""
        self._cap = rate
        self._shape()

    def uncap(self) -> None:
        self.cap(None)

    def _shape(self) -> None:
        # Sent: htb on eth0 in the host; received: htb on the host's port (the bridge sends through it).
        _shape_device("eth0", self.netns, self._cap, self._pair_caps)
        _shape_device(self.port, None, self._cap, {})


def _shape_device(dev: str, ns: str | None, rate: str | None, pairs: Mapping[str, str]) -> None:
    """Lay the htb tree for a cap of ``rate`` on the whole device (None: none) and ``pairs`` (destination
    address -> rate) on ``dev``, from scratch (queued packets are dropped: TCP sends them again)."""
    tc("qdisc", "del", "dev", dev, "root", ns=ns, check=False)
    if rate is None and not pairs:
        return
    top = rate or UNCAPPED
    tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "2", ns=ns)
    tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", top, "ceil", top, ns=ns)
    tc("class", "add", "dev", dev, "parent", "1:1", "classid", "1:2", "htb", "rate", top, "ceil", top, ns=ns)
    for minor, (dst, pair_rate) in enumerate(sorted(pairs.items()), start=16):
        tc("class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{minor:x}", "htb", "rate", pair_rate,
           "ceil", pair_rate, ns=ns)
        tc("filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
           "dst", f"{dst}/32", "flowid", f"1:{minor:x}", ns=ns)


class TestNet:
    """``n_hosts`` test hosts named ``h0``, ``h1``, ... (or hosts named ``names``) on a private bridge; see
    the module's documentation. A context manager; :meth:`close` may also be called directly.

    ``name_prefix`` starts the namespaces' names (``PREFIX-TAG-HOST``); ``watchdog`` starts a process that
    removes the net if this process is killed; ``grace`` is how long processes get between SIGTERM and
    SIGKILL when the net closes."""

    __test__ = False  # not a test class, whatever pytest makes of its name

    def __init__(self, n_hosts: int = 3, *, names: Sequence[str] | None = None, name_prefix: str = "tidal",
                 watchdog: bool = True, grace: float = 3.0) -> None:
        names = list(names) if names is not None else [f"h{i}" for i in range(n_hosts)]
        if not names or len(names) > 200:
            raise ValidationError(f"a test net has 1 to 200 hosts, not {len(names)}", field="n_hosts")
        for n in [name_prefix, *names]:
            if not hostsweep.valid_name(n):
                raise ValidationError(f"{n!r} cannot name a test host or prefix: a lower-case letter, then up to "
                                      "11 lower-case letters or digits", field="names")
        if len(set(names)) != len(names):
            raise ValidationError(f"host names must differ: {names}", field="names")
        self.prefix = name_prefix
        self.tag = hostsweep.new_tag()
        self.dir = hostsweep.run_dir(self.tag)
        self.shared = self.dir / "shared"
        self.bridge = hostsweep.bridge_name(self.tag)
        self.grace = grace
        self.subnet = ""  # 198.18.K.0/24, once built
        self.gateway = ""  # 198.18.K.1: the bridge's address, in this process's namespace
        self.hosts: list[Host] = []
        self._names = names
        self._watchdog = watchdog
        self._procs: list[subprocess.Popen[Any]] = []
        self._watchdog_proc: subprocess.Popen[bytes] | None = None
        self._on_close: list[Callable[[], object]] = []
        self._previous_sigterm: Any = None
        self._open = False

    def __repr__(self) -> str:
        return f"TestNet({self.tag}, {self.subnet}, hosts={[h.name for h in self.hosts]})"

    def __getitem__(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ValidationError(f"no host {name!r} in {self!r}", field="name")

    # building

    def __enter__(self) -> TestNet:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Build the net (on any failure, remove what was built and raise)."""
        hostsweep.write_record(self.tag, self.prefix)
        self._open = True
        self._trap_sigterm()
        try:
            if self._watchdog:
                self._watchdog_proc = subprocess.Popen(
                    [sys.executable, "-m", "tidal.testing.hostsweep", "--watch", str(os.getpid()),
                     "--tag", self.tag], start_new_session=True, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.shared.mkdir(mode=0o755)
            self.shared.chmod(0o755)
            with hostsweep.machine_lock():
                net = self._free_subnet()
                self.subnet = str(net)
                self.gateway = str(net.network_address + 1)
                hostsweep.ensure_guard_route()
                ip("link", "add", self.bridge, "type", "bridge")
                _no_ipv6(self.bridge)
                ip("addr", "add", f"{self.gateway}/{net.prefixlen}", "dev", self.bridge)
                ip("link", "set", self.bridge, "up")
            for i, name in enumerate(self._names):
                self.hosts.append(self._add_host(i, name, str(net.network_address + FIRST_HOST + i)))
        except BaseException:
            self.close()
            raise

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = set()
        for link in json.loads(ip("-j", "-4", "addr", "show").stdout):
            for a in link.get("addr_info", []):
                used.add(ipaddress.ip_network(f"{a['local']}/24", strict=False))
        for net in ipaddress.IPv4Network(SUPERNET).subnets(new_prefix=24):
            if net not in used:
                return net
        raise TidalError(f"every /24 of {SUPERNET} is taken by a test net",
                         hint="python -m tidal.testing.hostsweep removes the nets of runs that are gone")

    def _add_host(self, index: int, name: str, addr: str) -> Host:
        h = Host(self, index, name, addr)
        h.dir.mkdir(parents=True)
        for d in (h.dir.parent, h.dir):  # other accounts' services (postgres) keep their files there
            d.chmod(0o755)
        ip("netns", "add", h.netns)
        ip("link", "add", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
        _no_ipv6(h.port)
        ip("link", "set", h.port, "master", self.bridge, "up")
        ip("addr", "add", f"{addr}/{ipaddress.ip_network(self.subnet).prefixlen}", "dev", "eth0", ns=h.netns)
        ip("link", "set", "eth0", "up", ns=h.netns)
        ip("link", "set", "lo", "up", ns=h.netns)
        return h

    # shaping

    def cap(self, a: Host, b: Host, rate: str | None) -> None:
        """Cap the traffic between hosts ``a`` and ``b`` at ``rate`` (a ``tc`` rate: "100mbit") in each
        direction (``None`` lifts it); each host's other traffic is not touched."""
        if a is b:
            raise ValidationError(f"a cap is between two hosts, not {a.name} and itself", field="b")
        for src, dst in ((a, b), (b, a)):
            if rate is None:
                src._pair_caps.pop(dst.addr, None)
            else:
                src._pair_caps[dst.addr] = rate
            _shape_device("eth0", src.netns, src._cap, src._pair_caps)

    def uncap(self, a: Host, b: Host) -> None:
        self.cap(a, b, None)

    # closing

    def on_close(self, fn: Callable[[], object]) -> None:
        """Call ``fn`` when the net closes, before its processes are ended (the last registered first)."""
        self._on_close.append(fn)

    def leftovers(self) -> hostsweep.Leftovers:
        """What of this net is still on the machine (nothing, once closed)."""
        return hostsweep.find(self.tag).get(self.tag) or hostsweep.Leftovers(self.tag)

    def close(self) -> None:
        """Stop what was registered with :meth:`on_close`, end every process on the hosts, remove the
        namespaces, links, qdiscs and directories. Raises after trying everything if something is left."""
        if not self._open:
            return
        self._open = False
        problems: list[str] = []
        while self._on_close:
            fn = self._on_close.pop()
            try:
                fn()
            except Exception as e:
                problems.append(f"{fn!r}: {e!r}")
        try:
            hostsweep.destroy(self.tag, self.grace)
        except TidalError as e:
            problems.append(str(e))
        if self._watchdog_proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog_proc.kill()
            self._procs.append(self._watchdog_proc)
            self._watchdog_proc = None
        for proc in self._procs:
            if proc.poll() is None:  # one that left its host's namespace: its session, started for it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                problems.append(f"process {proc.pid} ({proc.args!r}) did not end")
        self._release_sigterm()
        if problems:
            raise TidalError(f"closing test net {self.tag}: " + "; ".join(problems))

    def _trap_sigterm(self) -> None:
        """While the net is open, SIGTERM raises KeyboardInterrupt in the main thread (as Ctrl-C: pytest stops
        and tears its fixtures down, so the net is closed) instead of ending the process on the spot; only
        where nobody else handles SIGTERM."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        self._previous_sigterm = signal.signal(signal.SIGTERM, handler)

    def _release_sigterm(self) -> None:
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _no_ipv6(link: str) -> None:
    """A switch and its ports have no addresses: no IPv6 link-local ones either."""
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")


def tcp_reachable(host: Host | None, addr: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection from ``host`` (``None``: this process's own namespace) to ``addr:port`` is
    accepted within ``timeout`` seconds (``ping`` is not installed on these machines)."""
    return _tcp_reachable(host.netns if host else None, addr, port, timeout)
