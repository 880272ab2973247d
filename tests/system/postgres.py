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
import time
from pathlib import Path

BIN_DIRS = ("/usr/local/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")


def find_bin(name: str) -> str | None:
    for d in BIN_DIRS:
        if os.access(Path(d) / name, os.X_OK):
            return str(Path(d) / name)
    return shutil.which(name)


class PostgresServer:
    def __init__(self) -> None:
        initdb, postgres = find_bin("initdb"), find_bin("postgres")
        if not initdb or not postgres:
            raise RuntimeError("PostgreSQL server binaries (initdb, postgres) not found")
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
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._connect().close()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "server.log").read_text(errors="replace")
                    raise RuntimeError(f"PostgreSQL did not start:\n{log}") from None
                time.sleep(0.1)

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
