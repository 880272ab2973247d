"""A throw-away Slurm cluster for tests: its own munge key and ``munged``, ``slurmctld`` and one ``slurmd`` per
node, all under one temporary directory, with a ``slurm.conf`` of its own (nothing of ``/etc/slurm`` or
``/etc/munge`` is read or touched), removed on :meth:`SlurmCluster.stop`, also when starting failed.

By default preemption is by partition priority (``preempt/partition_prio``, ``PreemptMode=REQUEUE`` with a
``GraceTime``): a job in partition ``high`` takes the node of a job in ``low``, which is sent SIGTERM,
given the grace time and requeued. The completion log (``jobcomp/filetxt``) and ``scontrol show job``
(``Restarts=``) show requeues without a database.

With ``accounting=True`` the cluster has Slurm's accounting: a MariaDB server of its own (``mariadbd`` on a
data directory under the cluster's, reached on a unix socket only, no network) and ``slurmdbd``, with the
cluster, an account ``tidal``, the user ``root`` and two QOS: jobs run in QOS ``low`` by default, and a job in
QOS ``high`` preempts them (``PreemptType=preempt/qos``; ``low`` has ``PreemptMode=REQUEUE`` and the
``GraceTime``). :meth:`SlurmCluster.sacct` reads the accounting records (every run of a requeued job).

Nodes are ``(name, address)`` pairs; a node with a network namespace (a test host of
:mod:`tidal.testing.hosts`) runs its ``slurmd`` inside it, so that several nodes on one machine are
reached over the network (``ctld_addr``: the test net's gateway, where the hosts reach ``slurmctld``).
Needs Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge``
(``make slurm``); with accounting also ``slurmdbd``, ``sacctmgr``, ``sacct`` and MariaDB's ``mariadbd`` and
``mariadb-install-db``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidal.errors import ConfigError, TidalError
from tidal.mechanisms.slurm.scontrol import fields as parse_record
from tidal.testing.netns import nsenter_argv
from tidal.waiting import wait_until

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")
ACCOUNTING_BINARIES = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
PORT_TRIES = 3  # starts of a daemon whose port was taken before it bound it


def missing_binaries(accounting: bool = False) -> list[str]:
    """What of Slurm and munge (with ``accounting``: also of slurmdbd and MariaDB) is not installed here
    (``make slurm`` installs it)."""
    names = BINARIES + (ACCOUNTING_BINARIES if accounting else ())
    return [b for b in names if shutil.which(b, path=PATH) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class SlurmNode:
    name: str
    addr: str = "127.0.0.1"
    netns: str | None = None  # the network namespace its slurmd runs in
    cpus: int = 1


class SlurmCluster:
    """One ``slurmctld`` and a ``slurmd`` per node. ``grace``: the ``GraceTime`` of a preempted job;
    ``over_time``: the ``OverTimeLimit`` (minutes a job may run past its limit); ``accounting``: with
    ``slurmdbd`` and its database, and preemption by QOS."""

    def __init__(self, nodes: Sequence[SlurmNode] = (SlurmNode("n1"),), *, grace: int = 30, over_time: int = 0,
                 root: Path | None = None, ctld_addr: str = "127.0.0.1", accounting: bool = False) -> None:
        missing = missing_binaries(accounting)
        if missing:
            raise ConfigError(f"Slurm is not installed here (missing {', '.join(missing)})", hint="run `make slurm`")
        self.nodes = list(nodes)
        self.root = root or Path(tempfile.mkdtemp(prefix="tidal-slurm-"))
        self._own_root = root is None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.grace, self.over_time, self.ctld_addr = grace, over_time, ctld_addr
        self.accounting = accounting
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    # -- start and stop -------------------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def db_socket(self) -> Path:
        return self.root / "db" / "mysqld.sock"

    def env(self) -> dict[str, str]:
        """What a Slurm client (``sbatch``, ``scontrol``) needs to reach this cluster."""
        return {"PATH": f"{os.environ.get('PATH', PATH)}:{PATH}", "SLURM_CONF": str(self.conf),
                "LC_ALL": "C"}

    def _start(self) -> None:
        for d in ("etc", "munge", "key", "ctld", "log", "spool"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # slurmstepd and the jobs traverse it
        os.chmod(self.root / "munge", 0o755)  # munged wants its socket reachable by every account
        os.chmod(self.root / "key", 0o700)
        key = self.root / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.ctld_port, self.slurmd_port, self.dbd_port = _free_port(), _free_port(), _free_port()
        self.conf.write_text(self._conf_text())
        self._spawn(["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
                     f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                     f"--seed-file={self.root / 'key' / 'munged.seed'}",
                     f"--log-file={self.root / 'log' / 'munged.log'}"], "munged")
        wait_until(lambda: self.munge_socket.exists(), timeout=20, what="munged to listen")
        if self.accounting:
            self._start_accounting()
        self._start_daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld",
                           lambda: self._run(["scontrol", "ping"], check=False).stdout.count("UP") > 0,
                           timeout=30, new_port=self._new_ctld_port)
        for n in self.nodes:
            argv = ["slurmd", "-D", "-N", n.name, "-f", str(self.conf)]
            if n.netns:
                # nsenter, not `ip netns exec`: that remounts /sys, without the cgroup mounts slurmd reads.
                argv = nsenter_argv(n.netns, argv)
            self._spawn(argv, f"slurmd-{n.name}")
        wait_until(self._all_idle, timeout=60, what="every slurmd to register", interval=0.2)

    def _start_accounting(self) -> None:
        """MariaDB on a unix socket only, ``slurmdbd``, and the cluster's associations and QOS."""
        db = self.root / "db"
        db.mkdir()
        # Its temporary tables in a directory of its own, not the machine's /tmp, where they are not safe from
        # what else runs (a bootstrap failed once: "Could not remove temporary table: '/tmp/#sql-temptable-…'").
        (db / "tmp").mkdir()
        tmpdir = f"--tmpdir={db / 'tmp'}"
        self._run(["mariadb-install-db", "--no-defaults", f"--datadir={db / 'data'}", "--user=root",
                   "--auth-root-authentication-method=socket", "--skip-test-db", tmpdir], timeout=120)
        self._spawn(["mariadbd", "--no-defaults", f"--datadir={db / 'data'}", f"--socket={self.db_socket}", tmpdir,
                     "--skip-networking", "--user=root", f"--pid-file={db / 'mariadbd.pid'}",
                     f"--log-error={self.root / 'log' / 'mariadbd.log'}", "--innodb-buffer-pool-size=64M",
                     "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin", "--innodb-lock-wait-timeout=900"],
                    "mariadbd")
        wait_until(lambda: self.db_socket.exists(), timeout=60, what="mariadbd to listen")
        self._write_dbd_conf()
        # slurmdbd reads slurmdbd.conf beside SLURM_CONF's slurm.conf; the MariaDB client library it links finds
        # the server's socket in MYSQL_UNIX_PORT (StorageHost=localhost: a unix socket).
        self._start_daemon(["slurmdbd", "-D"], "slurmdbd",
                           lambda: self._run(["sacctmgr", "-n", "-P", "show", "cluster"], check=False).returncode == 0,
                           timeout=60, new_port=self._new_dbd_port, extra_env={"MYSQL_UNIX_PORT": str(self.db_socket)})
        for cmd in (["add", "cluster", "tidaltest"],
                    ["add", "qos", "low", f"GraceTime={self.grace}", "PreemptMode=requeue"],
                    ["add", "qos", "high", "Preempt=low"],
                    ["add", "account", "tidal", "Cluster=tidaltest"],
                    ["add", "user", "root", "Account=tidal", "Cluster=tidaltest", "QOS=normal,low,high",
                     "DefaultQOS=low"],
                    # root has an association under account root already (made with the cluster).
                    ["modify", "user", "root", "set", "DefaultAccount=tidal"]):
            self._run(["sacctmgr", "-i", *cmd])

    def _start_daemon(self, argv: list[str], name: str, ready: Callable[[], bool], *, timeout: float,
                      new_port: Callable[[], None], extra_env: dict[str, str] | None = None) -> None:
        """Start a daemon and wait until ``ready()``. Its port was free when chosen, but another process may have
        bound it since (an outgoing connection's ephemeral port comes from the same range): a daemon that exits
        for that is started again on a port ``new_port`` picks. Any other exit, or no answer, is an error that
        ends with the daemon's log."""
        log = self.root / "log" / f"{name}.out"
        for attempt in range(1, PORT_TRIES + 1):
            since = log.stat().st_size if log.exists() else 0  # the log is appended to: this start's lines only
            self._spawn(argv, name, extra_env)
            proc = self.procs[-1]

            def answers(p: subprocess.Popen[bytes] = proc) -> str | None:
                return "exited" if p.poll() is not None else "up" if ready() else None

            try:
                up = wait_until(answers, timeout=timeout, what=f"{name} to answer", interval=0.2)
            except TidalError as e:
                raise TidalError(f"{e}; the end of its log:\n{self._log_tail(name, since)}") from e
            if up != "exited":
                return
            self.procs.remove(proc)
            tail = self._log_tail(name, since)
            if "Address already in use" not in tail or attempt == PORT_TRIES:
                raise TidalError(f"{name} exited with code {proc.returncode} while starting; the end of its log:\n"
                                 f"{tail}")
            new_port()

    def _log_tail(self, name: str, since: int = 0, chars: int = 2000) -> str:
        """The end of what the daemon wrote since byte ``since`` of its log."""
        with contextlib.suppress(OSError), open(self.root / "log" / f"{name}.out", "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")[-chars:] or "(empty)"
        return "(no log)"

    def _new_ctld_port(self) -> None:
        self.ctld_port = _free_port()
        self.conf.write_text(self._conf_text())

    def _new_dbd_port(self) -> None:
        self.dbd_port = _free_port()
        self.conf.write_text(self._conf_text())
        self._write_dbd_conf()

    def _write_dbd_conf(self) -> None:
        dbd_conf = self.conf.with_name("slurmdbd.conf")
        dbd_conf.write_text(self._dbd_conf_text())
        os.chmod(dbd_conf, 0o600)  # slurmdbd insists: it holds the database's credentials

    def _dbd_conf_text(self) -> str:
        r = self.root
        return "\n".join([
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"DbdHost={socket.gethostname()}",
            f"DbdAddr={self.ctld_addr}",
            f"DbdPort={self.dbd_port}",
            "SlurmUser=root",
            "DebugLevel=info",
            f"LogFile={r / 'log' / 'slurmdbd.log'}",
            f"PidFile={r / 'db' / 'slurmdbd.pid'}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=localhost",
            "StorageUser=root",
            "StorageLoc=slurm_acct_db",
        ]) + "\n"

    def _all_idle(self) -> bool:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n.name, "").startswith("idle") for n in self.nodes)

    def _conf_text(self) -> str:
        r = self.root
        lines = [
            "ClusterName=tidaltest",
            f"SlurmctldHost={socket.gethostname()}({self.ctld_addr})",
            "MailProg=/bin/true",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire is also how long a requeued job waits before it may start again (default 120 s).
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "SchedulerParameters=sched_interval=1,bf_interval=1,sched_min_interval=100000",
            f"StateSaveLocation={r / 'ctld'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'ctld' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # Signals go to the step's process groups: Tidal's ranks run in sessions of their own, so SIGTERM
            # reaches `tidal run`, which checkpoints them, and not the ranks themselves.
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *(["AccountingStorageType=accounting_storage/slurmdbd", f"AccountingStorageHost={self.ctld_addr}",
               f"AccountingStoragePort={self.dbd_port}", "AccountingStorageEnforce=associations,limits,qos",
               # Not a password with slurmdbd: the munge socket to reach it with (else munge's default one).
               f"AccountingStoragePass={self.munge_socket}",
               "PreemptType=preempt/qos"]
              if self.accounting else
              ["AccountingStorageType=accounting_storage/none", "PreemptType=preempt/partition_prio"]),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r / 'log' / 'jobcomp.log'}",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/linear",
            "PreemptMode=REQUEUE",
            "ReturnToService=2",
            # A preempted batch job's script gets SIGTERM when its GraceTime is over (Slurm signals only the job's
            # steps at its start) and SIGKILL KillWait seconds later: `tidal run`'s checkpoint happens in between.
            "KillWait=30",
            "MinJobAge=600",
            "InactiveLimit=0",
            f"OverTimeLimit={self.over_time}",
            "MessageTimeout=10",
            "SlurmdTimeout=60",
            "UnkillableStepTimeout=60",
            "Prolog=",
            "RebootProgram=",
        ]
        for n in self.nodes:
            lines.append(f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} CPUs={n.cpus} State=UNKNOWN")
        names = ",".join(n.name for n in self.nodes)
        if self.accounting:  # one partition; the jobs' QOS decide who preempts whom
            lines.append(f"PartitionName=main Nodes={names} Default=YES MaxTime=INFINITE State=UP")
            return "\n".join(ln for ln in lines if not ln.endswith("=")) + "\n"
        lines += [
            f"PartitionName=low Nodes={names} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            f"PreemptMode=REQUEUE GraceTime={self.grace}",
            f"PartitionName=high Nodes={names} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
        ]
        return "\n".join(ln for ln in lines if not ln.endswith("=")) + "\n"

    def _spawn(self, argv: list[str], name: str, extra_env: dict[str, str] | None = None) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon's, closed with it
        try:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               env={**self.env(), **(extra_env or {})}, start_new_session=True))
        finally:
            out.close()

    def stop(self) -> None:
        """End every job and daemon of the cluster and remove its directory."""
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self.procs.clear()
        # A job's steps left behind by a slurmd that was stopped (their slurmstepd runs in a session of its own).
        for pid in _pids_under(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _thaw(pid)  # a rank left frozen by a checkpoint cut short dies only once thawed
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients --------------------------------------------------------------------------------------------
    def _run(self, argv: list[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)
        if check and out.returncode != 0:
            raise TidalError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def client(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``scontrol``, ``squeue``, ...) against this cluster."""
        return self._run(list(argv), check=check)

    def sbatch(self, script: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
        """Submit ``script``; its job id."""
        out = subprocess.run(["sbatch", "--parsable", *args, str(script)], env={**self.env(), **(env or {})},
                             cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
        if out.returncode != 0:
            raise TidalError(f"sbatch failed: {out.stderr.strip()}")
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` of one job, as its ``Key=Value`` fields."""
        return parse_record(self._run(["scontrol", "-o", "show", "job", job_id]).stdout)

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float) -> dict[str, str]:
        def reached() -> dict[str, str] | None:
            info = self.job(job_id)
            return info if info.get("JobState") in states else None

        return wait_until(reached, timeout=timeout, what=f"job {job_id} to be {' or '.join(states)}", interval=0.3)

    def sacct(self, job_id: str) -> list[dict[str, str]]:
        """Slurm's accounting records of a job's allocation, one per run (``sacct --duplicates``: a requeued
        job's earlier runs too), oldest first, with the fields of ``fields`` below. Needs ``accounting=True``."""
        fields = ("JobIDRaw", "State", "Submit", "Start", "End", "Elapsed", "QOS", "ExitCode")
        out = self._run(["sacct", "-X", "-n", "-P", "--duplicates", "-j", job_id, "-o", ",".join(fields)]).stdout
        return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]

    def completions(self) -> list[dict[str, str]]:
        """The completion log: one record per end of a job (also each end that was requeued)."""
        path = self.root / "log" / "jobcomp.log"
        if not path.exists():
            return []
        return [parse_record(line) for line in path.read_text().splitlines() if line.strip()]

    def logs(self) -> str:
        """The daemons' logs, for a failing test's message."""
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                parts.append(f"== {f.name}\n{f.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


def _thaw(pid: int) -> None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(","):
                Path("/sys/fs/cgroup/freezer", path.lstrip("/"), "freezer.state").write_text("THAWED")


def _pids_under(root: Path) -> list[int]:
    """Processes whose command line names ``root`` (slurmstepd of this cluster's nodes)."""
    found = []
    needle = str(root).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (d / "cmdline").read_bytes() or needle in (d / "environ").read_bytes():
                found.append(int(d.name))
    return found


__all__ = ["SlurmCluster", "SlurmNode", "missing_binaries", "parse_record"]
