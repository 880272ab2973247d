"""``tidal doctor --slurm``: is this Slurm site set up so that ``tidal run`` loses no work?

Reads the controller's configuration (``scontrol show config``, ``scontrol show partition``; with
``PreemptType=preempt/qos`` the QOS from the accounting database, ``sacctmgr show qos``), opens the
checkpoint store, and runs a CRIU lookup on every node through ``srun`` (one task per node)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from tidal.mechanisms.checks import Check, Planned, need, run_command
from tidal.mechanisms.slurm.scontrol import fields
from tidal.mechanisms.slurm.step import expand_hostlist

MIN_SLURM = (20, 11)
CRIU_PROBE = "from tidal.mechanisms.criu.provision import find_criu; print(find_criu().version)"


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = Value`` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show partition``: each partition's ``Key=Value`` fields."""
    parts = {}
    for line in text.splitlines():
        record = fields(line)
        if "PartitionName" in record:
            parts[record["PartitionName"]] = record
    return parts


def parse_qos(text: str) -> dict[str, dict[str, str]]:
    """``sacctmgr -n -P show qos format=Name,GraceTime,Preempt,PreemptMode``: each QOS's fields, its
    ``GraceTime`` in seconds."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            name, grace, preempt, mode = parts
            out[name] = {"GraceTime": str(_seconds(grace)), "Preempt": preempt, "PreemptMode": mode}
    return out


def _seconds(text: str) -> int:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) as seconds; 0 where empty."""
    days, _, clock = text.rpartition("-")
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part or 0)
    return total + int(days or 0) * 86400


def _preemptable(qos: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The QOS that some other QOS may preempt, in the order listed."""
    named = {n for q in qos.values() for n in q.get("Preempt", "").split(",") if n}
    return [n for n in qos if n in named]


def check_version(conf: Mapping[str, str]) -> Check:
    raw = conf.get("SLURM_VERSION", "")
    m = re.match(r"(\d+)\.(\d+)", raw)
    if not m:
        return Check("slurm", "missing", "no answer from slurmctld (scontrol show config)",
                     "run it where the Slurm clients reach the controller (SLURM_CONF)", True)
    ok = (int(m.group(1)), int(m.group(2))) >= MIN_SLURM
    return Check("slurm", need(ok, True), f"Slurm {raw}, cluster {conf.get('ClusterName', '?')}",
                 "" if ok else f"Slurm ≥ {MIN_SLURM[0]}.{MIN_SLURM[1]} (requeue and --signal=B:)", True)


def check_preempt_mode(conf: Mapping[str, str], parts: Mapping[str, Mapping[str, str]],
                       qos: Mapping[str, Mapping[str, str]] | None = None) -> Check:
    """With ``preempt/qos``, ``qos`` (:func:`parse_qos`) decides: the preemptable QOS' ``PreemptMode``, or the
    cluster's where theirs is ``cluster``."""
    mode = conf.get("PreemptMode", "OFF")
    kind = conf.get("PreemptType", "preempt/none")
    if kind == "preempt/qos" and qos is not None:
        own = {n: q["PreemptMode"] for n, q in qos.items() if q["PreemptMode"] not in ("", "cluster")}
        bad = [n for n in _preemptable(qos) if "REQUEUE" not in own.get(n, mode).upper()]
        what = "QOS"
    else:
        bad = [n for n, p in parts.items() if "REQUEUE" not in p.get("PreemptMode", mode).upper()
               and p.get("PreemptMode", mode).upper() not in ("OFF",)]
        what = "partitions"
    if kind == "preempt/none":
        return Check("slurm: PreemptMode", "ok", "no preemption (PreemptType=preempt/none)")
    if "REQUEUE" in mode.upper() and not bad:
        return Check("slurm: PreemptMode", "ok", f"{mode} ({kind})")
    return Check("slurm: PreemptMode", "warn", f"{mode} ({kind}); {what} not requeueing: {', '.join(bad) or '-'}",
                 "set PreemptMode=REQUEUE: a cancelled job is not started again, a suspended one holds its memory")


def check_grace_time(conf: Mapping[str, str], parts: Mapping[str, Mapping[str, str]],
                     qos: Mapping[str, Mapping[str, str]] | None = None) -> Check:
    """The preemptable partitions' ``GraceTime``; with ``preempt/qos`` the preemptable QOS' (``qos``). Any is
    fine for ``tidal run``: the checkpoint comes at its end."""
    kind = conf.get("PreemptType", "preempt/none")
    if kind == "preempt/none":
        return Check("slurm: GraceTime", "ok", "no preemption")
    mode = conf.get("PreemptMode", "OFF")
    if kind == "preempt/qos":
        if qos is None:
            return Check("slurm: GraceTime", "warn", "the QOS could not be read (sacctmgr show qos)",
                         "run it where sacctmgr reaches slurmdbd")
        graces = {n: int(qos[n]["GraceTime"]) for n in _preemptable(qos)}
        prefix = "qos "
    else:
        graces = {n: int(p.get("GraceTime", "0") or 0) for n, p in parts.items()
                  if p.get("PreemptMode", mode).upper() != "OFF"}  # partitions whose jobs can be preempted
        prefix = ""
    # Shown, not judged: a preempted job's batch script (tidal run) gets SIGTERM only when the GraceTime is over
    # (at Slurm's next 30-second check after it), so the GraceTime just delays the checkpoint, which happens
    # within KillWait (check_signals). 0 preempts soonest. A step over several nodes is checkpointed within the
    # GraceTime instead (its tasks are signalled at its start; srun kills them at its end): said, not judged.
    detail = prefix + (", ".join(f"{n}={g}s" for n, g in graces.items()) or "no QOS is preempted by another")
    if any(g == 0 for g in graces.values()):
        detail += " (0 s: fine for one-task jobs; a step over several nodes needs longer than its checkpoint)"
    return Check("slurm: GraceTime", "ok", detail)


def check_signals(conf: Mapping[str, str]) -> Check:
    """SIGTERM must reach ``tidal run``, not the ranks themselves; a requeue must be allowed."""
    track = conf.get("ProctrackType", "")
    requeue = conf.get("JobRequeue", "1")
    kill_wait = conf.get("KillWait", "")
    notes = [f"ProctrackType={track}", f"JobRequeue={requeue}", f"KillWait={kill_wait}"]
    wait = re.match(r"\d+", kill_wait)
    if track == "proctrack/linuxproc":
        return Check("slurm: signals", "warn", "; ".join(notes),
                     "proctrack/linuxproc sends SIGTERM to every process of a job, the ranks too, before Tidal can "
                     "checkpoint them: use proctrack/cgroup or proctrack/pgid")
    if requeue == "0":
        return Check("slurm: signals", "warn", "; ".join(notes),
                     "JobRequeue=0: jobs must be submitted with --requeue to be started again")
    if wait and int(wait.group(0)) < 10:
        return Check("slurm: signals", "warn", "; ".join(notes),
                     "a preempted job's batch script (tidal run) gets SIGTERM when its GraceTime is over and SIGKILL "
                     "KillWait seconds later: give KillWait at least the time a checkpoint takes (≥ 10 s)")
    return Check("slurm: signals", "ok", "; ".join(notes) +
                 "; jobs ask for the warning with sbatch --signal=B:USR1@SECONDS")


def check_store(url: str | None) -> Check:
    if not url:
        return Check("slurm: store", "missing", "no checkpoint store (TIDAL_CHECKPOINT_STORE or --store)",
                     "a directory every node mounts at the same path, or s3://bucket/prefix", True)
    from tidal.config import load_settings
    from tidal.mechanisms.storage import CheckpointStore, store_options

    try:
        with CheckpointStore(url, **store_options(load_settings(), url)) as store:
            store.list("tidal-doctor")
    except Exception as exc:  # any failure to reach it is the finding
        return Check("slurm: store", "missing", f"{url}: {exc}", "check the URL and its credentials", True)
    if "://" not in url and not os.path.isabs(url):
        return Check("slurm: store", "warn", f"{url} (a relative path)", "give an absolute path on shared storage",
                     True)
    return Check("slurm: store", "ok", url, "", True)


def check_criu_on_nodes(conf: Mapping[str, str]) -> Check:
    code, out = run_command(["sinfo", "-h", "-o", "%N"], timeout=30)
    nodes = sorted({n for line in out.splitlines() for n in expand_hostlist(line.strip())}) if code == 0 else []
    if not nodes:
        return Check("slurm: criu on nodes", "warn", f"no nodes listed by sinfo: {out[-200:]}",
                     "run it where the Slurm clients reach the controller", True)
    argv = ["srun", "--immediate=60", f"--nodes={len(nodes)}", "--ntasks-per-node=1", "--label",
            sys.executable, "-c", CRIU_PROBE]
    code, out = run_command(argv, timeout=120)
    good = {line.split(":", 1)[0].strip() for line in out.splitlines() if re.match(r"^\d+: \S", line)}
    if code == 0 and len(good) == len(nodes):
        return Check("slurm: criu on nodes", "ok", f"CRIU works on all {len(nodes)} node(s)", "", True)
    return Check("slurm: criu on nodes", "missing", f"{len(good)} of {len(nodes)} node(s): {out[-300:]}",
                 "install CRIU ≥ 4.0 (or `make criu`) at the same path on every node, with Tidal's Python", True)


def slurm_checks(store_url: str | None) -> list[Planned]:
    """The site's checks, in display order; one read of the controller's configuration."""
    code, text = run_command(["scontrol", "show", "config"], timeout=30)
    conf = parse_config(text) if code == 0 else {}
    code, text = run_command(["scontrol", "-o", "show", "partition"], timeout=30)
    parts = parse_partitions(text) if code == 0 else {}
    qos = None
    if conf.get("PreemptType") == "preempt/qos":
        code, text = run_command(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,GraceTime,Preempt,PreemptMode"],
                                 timeout=30)
        qos = parse_qos(text) if code == 0 else None
    return [
        Planned("slurm", True, lambda: check_version(conf)),
        Planned("slurm: PreemptMode", False, lambda: check_preempt_mode(conf, parts, qos)),
        Planned("slurm: GraceTime", False, lambda: check_grace_time(conf, parts, qos)),
        Planned("slurm: signals", False, lambda: check_signals(conf)),
        Planned("slurm: store", True, lambda: check_store(store_url)),
        Planned("slurm: criu on nodes", True, lambda: check_criu_on_nodes(conf)),
    ]
