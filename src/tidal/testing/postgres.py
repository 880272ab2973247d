"""A throw-away PostgreSQL server for tests: ``initdb`` and ``postgres`` on a temporary directory and a
loopback port, or on a test host's address (:mod:`tidal.testing.hosts`), run as the unprivileged
``postgres`` user (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tidal.errors import ConfigError, TidalError
from tidal.waiting import WaitTimeout, wait_until

if TYPE_CHECKING:
    from tidal.testing.hosts import Host

BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")


def find_bin(name: str) -> str | None:
    for d in BIN_DIRS:
        if os.access(Path(d) / name, os.X_OK):
            return str(Path(d) / name)
    return shutil.which(name)


class PostgresServer:
    """A new cluster, started at once; :meth:`create_database` makes a database and gives its URL,
    :meth:`stop` ends the server and removes its files. Needs root and a ``postgres`` account.

    By default it listens on a free port of 127.0.0.1. With ``host`` (a test host) it runs on that host and
    listens on its address (port 5432 unless ``port`` says otherwise), any host of the host's net may
    connect (as may the CIDRs of ``allow``, with no password), its files are under the host's directory,
    and it stops when the net closes. :meth:`shutdown` and :meth:`start` stop and start it again on the
    same data (:meth:`restart` both), for tests of faults."""

    def __init__(self, *, host: Host | None = None, port: int | None = None, allow: Sequence[str] = ()) -> None:
        initdb, postgres = find_bin("initdb"), find_bin("postgres")
        if not initdb or not postgres:
            raise ConfigError("PostgreSQL server binaries (initdb, postgres) not found",
                              hint=f"install them in one of {', '.join(BIN_DIRS)} or on PATH")
        self._postgres = postgres
        self.host = host
        self.addr = host.addr if host else "127.0.0.1"
        self.user = pwd.getpwnam("postgres")
        if host is None:
            self.dir = Path(tempfile.mkdtemp(prefix="tidal-pg-"))
        else:
            self.dir = host.dir / "postgres"
            self.dir.mkdir(parents=True)
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = self.dir / "data"
        self._as_postgres([initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])
        allowed = [*allow, *([host.net.subnet] if host else [])]
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.writelines(f"host all all {cidr} trust\n" for cidr in allowed)
        if port is None and host is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port: int = port or 5432
        self.proc: subprocess.Popen[bytes] | None = None
        self._removed = False
        # On loopback nothing else ends the server if this process is killed: it dies with the thread that
        # started it (``setpriv --pdeathsig``), a thread of its own that lives until stop().
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="postgres") if host is None else None
        self.start()
        if host is not None:
            host.net.on_close(self.stop)

    def start(self) -> None:
        """Start the server on its data (again), and wait until it accepts connections."""
        server = [self._postgres, "-D", str(self.data), "-p", str(self.port), "-h", self.addr, "-k", str(self.dir),
                  "-c", "fsync=off"]
        with open(self.dir / "server.log", "ab") as log:
            if self._spawner is None:
                assert self.host is not None
                self.proc = self.host.popen(["runuser", "-u", "postgres", "--", *server], stdout=subprocess.DEVNULL,
                                            stderr=log)
            else:  # setpriv, not runuser: it changes the account and execs, so the death signal stays set
                argv = ["setpriv", "--reuid", "postgres", "--regid", "postgres", "--init-groups", "--pdeathsig",
                        "KILL", "--", *server]
                self.proc = self._spawner.submit(subprocess.Popen, argv, stdout=subprocess.DEVNULL, stderr=log,
                                                 start_new_session=True).result()
        self._wait_ready()

    def _as_postgres(self, argv: list[str]) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True,
                       cwd=self.dir, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{self.addr}:{self.port}/{database}"

    def _connect(self, database: str = "postgres"):  # type: ignore[no-untyped-def]
        import psycopg

        return psycopg.connect(f"host={self.addr} port={self.port} user=postgres dbname={database}",
                               autocommit=True, connect_timeout=5)

    def _wait_ready(self, timeout: float = 60) -> None:
        def ready() -> str:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return f"it exited with {self.proc.returncode}"
            self._connect().close()  # refused until it is up: wait_until tries again
            return "ready"

        try:
            outcome = wait_until(ready, timeout=timeout, interval=0.1,
                                 what=f"PostgreSQL on {self.addr}:{self.port} to accept connections")
        except WaitTimeout as e:
            outcome = str(e)
        if outcome != "ready":
            log = (self.dir / "server.log").read_text(errors="replace")
            raise TidalError(f"PostgreSQL did not start: {outcome}\n{log}")

    def create_database(self, name: str) -> str:
        with self._connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def shutdown(self, mode: Literal["fast", "immediate"] = "fast") -> None:
        """Stop the server, keeping its data: ``fast`` (SIGINT: clients are disconnected, a checkpoint is
        written) or ``immediate`` (SIGQUIT: as a crash, the next start recovers from the WAL)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def restart(self, mode: Literal["fast", "immediate"] = "fast") -> None:
        self.shutdown(mode)
        self.start()

    def stop(self) -> None:
        """Stop the server and remove its files (again: nothing)."""
        self.shutdown()
        if self._spawner is not None:
            self._spawner.shutdown()
        if not self._removed:
            self._removed = True
            shutil.rmtree(self.dir, ignore_errors=True)
