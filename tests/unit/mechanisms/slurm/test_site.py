"""`tidal doctor --slurm`'s reading of a site's configuration."""

from __future__ import annotations

from tidal.mechanisms.slurm.site import (
    check_grace_time,
    check_preempt_mode,
    check_signals,
    check_version,
    parse_config,
    parse_partitions,
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
    conf, parts = parse_config(CONFIG), parse_partitions(PARTITIONS)
    assert conf["SLURM_VERSION"] == "22.05.8" and parts["low"]["GraceTime"] == "120"
    assert check_version(conf).status == "ok"
    assert check_version(conf).detail == "Slurm 22.05.8, cluster prod"
    assert check_preempt_mode(conf, parts).status == "ok"
    assert check_signals(conf).status == "ok"
    grace = check_grace_time(conf, parts)
    # A preemptable partition without a grace time: its jobs are killed before they are checkpointed.
    assert (grace.status, grace.detail) == ("warn", "low=120s, debug=0s")
    assert "debug would be killed before their checkpoint is committed" in grace.fix


def test_what_loses_work() -> None:
    conf = parse_config(CONFIG.replace("REQUEUE", "CANCEL").replace("proctrack/cgroup", "proctrack/linuxproc"))
    parts = parse_partitions(PARTITIONS.replace("REQUEUE", "CANCEL"))
    mode = check_preempt_mode(conf, parts)
    assert mode.status == "warn" and mode.fix.startswith("set PreemptMode=REQUEUE")
    signals = check_signals(conf)
    assert signals.status == "warn" and "use proctrack/cgroup or proctrack/pgid" in signals.fix
    missing = check_version({})
    assert (missing.status, missing.required) == ("missing", True)
