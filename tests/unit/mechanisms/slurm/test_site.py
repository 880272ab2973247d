"""`tidal doctor --slurm`'s reading of a site's configuration."""

from __future__ import annotations

from tidal.mechanisms.slurm.site import (
    check_grace_time,
    check_preempt_mode,
    check_signals,
    check_version,
    parse_config,
    parse_partitions,
    parse_qos,
)

CONFIG = """Configuration data as of 2026-11-25T22:00:00
ClusterName             = prod
PreemptMode             = REQUEUE
PreemptType             = preempt/qos
ProctrackType           = proctrack/cgroup
JobRequeue              = 1
KillWait                = 30 sec
SLURM_VERSION           = 22.05.8
"""
PARTITIONS = ("PartitionName=low AllowGroups=ALL GraceTime=120 PreemptMode=REQUEUE State=UP\n"
              "PartitionName=debug AllowGroups=ALL GraceTime=0 PreemptMode=REQUEUE State=UP\n"
              "PartitionName=high AllowGroups=ALL GraceTime=0 PreemptMode=OFF State=UP\n")


def test_a_site_set_up_for_tidal() -> None:
    # Preemption by partition priority: the partitions' GraceTime counts.
    conf = parse_config(CONFIG.replace("preempt/qos", "preempt/partition_prio"))
    parts = parse_partitions(PARTITIONS)
    assert conf["SLURM_VERSION"] == "22.05.8" and parts["low"]["GraceTime"] == "120"
    assert check_version(conf).status == "ok"
    assert check_version(conf).detail == "Slurm 22.05.8, cluster prod"
    assert check_preempt_mode(conf, parts).status == "ok"
    assert check_signals(conf).status == "ok"
    grace = check_grace_time(conf, parts)
    # Any grace time will do (it delays the SIGTERM; the checkpoint happens within KillWait): shown.
    assert (grace.status, grace.detail) == (
        "ok", "low=120s, debug=0s (0 s: fine for one-task jobs; a step over several nodes needs longer than its "
              "checkpoint)")


def test_what_loses_work() -> None:
    conf = parse_config(CONFIG.replace("REQUEUE", "CANCEL").replace("proctrack/cgroup", "proctrack/linuxproc"))
    parts = parse_partitions(PARTITIONS.replace("REQUEUE", "CANCEL"))
    mode = check_preempt_mode(conf, parts)
    assert mode.status == "warn" and mode.fix.startswith("set PreemptMode=REQUEUE")
    signals = check_signals(conf)
    assert signals.status == "warn" and "use proctrack/cgroup or proctrack/pgid" in signals.fix
    missing = check_version({})
    assert (missing.status, missing.required) == ("missing", True)


# sacctmgr -n -P show qos format=Name,GraceTime,Preempt,PreemptMode
QOS = ("normal|00:00:00||cluster\nlow|00:02:00||requeue\nscavenger|1-00:00:05||cluster\n"
       "high|00:00:00|low,scavenger|cluster\n")


def test_preemption_by_qos() -> None:
    conf, parts, qos = parse_config(CONFIG), parse_partitions(PARTITIONS), parse_qos(QOS)
    assert qos["low"] == {"GraceTime": "120", "Preempt": "", "PreemptMode": "requeue"}
    assert qos["scavenger"]["GraceTime"] == str(86405)
    # The QOS that others preempt count, not the partitions; "cluster" is the cluster's PreemptMode (REQUEUE).
    mode = check_preempt_mode(conf, parts, qos)
    assert (mode.status, mode.detail) == ("ok", "REQUEUE (preempt/qos)")
    grace = check_grace_time(conf, parts, qos)
    assert (grace.status, grace.detail) == ("ok", "qos low=120s, scavenger=86405s")
    cancels = parse_qos(QOS.replace("scavenger|1-00:00:05||cluster", "scavenger|00:00:05||cancel"))
    mode = check_preempt_mode(conf, parts, cancels)
    assert (mode.status, mode.detail) == ("warn", "REQUEUE (preempt/qos); QOS not requeueing: scavenger")
    grace = check_grace_time(conf, parts, cancels)
    assert (grace.status, grace.detail) == ("ok", "qos low=120s, scavenger=5s")
    assert check_grace_time(conf, parts, None).status == "warn"  # sacctmgr did not answer


def test_kill_wait_too_short_for_a_checkpoint() -> None:
    signals = check_signals(parse_config(CONFIG.replace("30 sec", "5 sec")))
    assert signals.status == "warn" and "give KillWait at least the time a checkpoint takes" in signals.fix
