"""A throw-away PostgreSQL server for tests: ``initdb`` and ``postgres`` on a temporary directory and a
loopback port, run as the unprivileged ``postgres`` user (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from tidal.errors import ConfigError, TidalError
from tidal.waiting import WaitTimeout, wait_until

BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")


def find_bin(name: str) -> str | None:
    for d in BIN_DIRS:
        if os.access(Path(d) / name, os.X_OK):
            return str(Path(d) / name)
    return shutil.which(name)


class PostgresServer:
    """A new cluster, started at once; :meth:`create_database` makes a database and gives its URL,
    :meth:`stop` ends the server and removes its files. Needs root and a ``postgres`` account."""

    def __init__(self) -> None:
        initdb, postgres = find_bin("initdb"), find_bin("postgres")
        if not initdb or not postgres:
            raise ConfigError("PostgreSQL server binaries (initdb, postgres) not found",
                              hint=f"install them in one of {', '.join(BIN_DIRS)} or on PATH")
        self.user = pwd.getpwnam("postgres")
        self.dir = Path(tempfile.mkdtemp(prefix="tidal-pg-"))
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        data = self.dir / "data"
        self._as_postgres([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        with open(self.dir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(
                ["runuser", "-u", "postgres", "--", postgres, "-D", str(data), "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", str(self.dir), "-c", "fsync=off"],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        self._wait_ready()

    def _as_postgres(self, argv: list[str]) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True,
                       cwd=self.dir, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _connect(self, database: str = "postgres"):  # type: ignore[no-untyped-def]
        import psycopg

        return psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname={database}",
                               autocommit=True)

    def _wait_ready(self, timeout: float = 60) -> None:
        def ready() -> str:
            if self.proc.poll() is not None:
                return f"it exited with {self.proc.returncode}"
            self._connect().close()  # refused until it is up: wait_until tries again
            return "ready"

        try:
            outcome = wait_until(ready, timeout=timeout, interval=0.1,
                                 what=f"PostgreSQL on port {self.port} to accept connections")
        except WaitTimeout as e:
            outcome = str(e)
        if outcome != "ready":
            log = (self.dir / "server.log").read_text(errors="replace")
            raise TidalError(f"PostgreSQL did not start: {outcome}\n{log}")

    def create_database(self, name: str) -> str:
        with self._connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)  # fast shutdown
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
