"""Virtual devices on a machine without GPUs: each device is a real share of the CPUs.

With at least as many usable cores as devices, a device is a disjoint CPU set. With fewer cores, devices
share cores round-robin and each device also gets a CPU quota through the cgroup v1 cpu controller
(``cpu.cfs_quota_us``), so that a rank really gets one device's worth of CPU and no more."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from tidal.errors import ConfigError
from tidal.mechanisms.criu import tasks
from tidal.mechanisms.criu.cgroups import ROOT

log = logging.getLogger(__name__)
PERIOD_US = 100_000


def cpu_sets(devices: int, cpus: list[int] | None = None) -> list[list[int]]:
    if devices < 1:
        raise ConfigError(f"a node needs at least one device, not {devices}", hint="give it --devices 1 or more")
    cores = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cores) >= devices:
        per = len(cores) // devices
        return [cores[i * per:(i + 1) * per] for i in range(devices)]
    return [[cores[i % len(cores)]] for i in range(devices)]


class CpuQuota:
    """One cpu cgroup per device, ``<cgroup root>/cpu/tidal-devices/<node>/dev<i>``, each allowed
    ``cores / devices`` of a CPU. Inactive (``enabled`` False) when every device has its own cores."""

    def __init__(self, node: str, devices: int, cores: int | None = None) -> None:
        cores = cores or len(os.sched_getaffinity(0))
        self.share = cores / devices
        self.base = ROOT / "cpu" / "tidal-devices" / node
        self.enabled = devices > cores and (ROOT / "cpu" / "cgroup.procs").exists()
        self.devices = devices
        if self.enabled:
            for i in range(devices):
                d = self.path(i)
                d.mkdir(parents=True, exist_ok=True)
                (d / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(str(int(self.share * PERIOD_US)))
            log.info("%d devices on %d cores: each device is %.2f of a CPU (cgroup quota)",
                     devices, cores, self.share)

    def path(self, device: int) -> Path:
        return self.base / f"dev{device}"

    def place(self, device: int, root_pid: int) -> None:
        """Put every process of a rank (its init and all below it; threads follow their process) under
        the device's quota. Children it forks later inherit it."""
        if not self.enabled:
            return
        procs = self.path(device) / "cgroup.procs"
        placed: set[int] = set()
        while True:  # a process forked by one not moved yet stays behind: list again until none is new
            new = [pid for pid in tasks.descendants(root_pid) if pid not in placed]
            if not new:
                return
            for pid in new:
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    procs.write_text(str(pid))
                placed.add(pid)
