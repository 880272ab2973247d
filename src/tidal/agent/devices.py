"""Virtual devices on a machine without GPUs: each device is a real share of the CPUs.

With at least as many usable cores as devices, a device is a disjoint CPU set (the ranks' CPU affinity).
With fewer cores, devices share cores round-robin and each device also gets a CPU quota, so that a rank
really gets one device's worth of CPU and no more: on cgroup v1 a group of the cpu controller per device
(``cpu.cfs_quota_us``), on cgroup2 a group per device with ``cpu.max`` (and ``cpuset.cpus``, where the
cpuset controller is there) that the ranks' own groups move below (see
:mod:`tidal.mechanisms.criu.cgroups`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from tidal.errors import ConfigError, MechanismError
from tidal.mechanisms.criu import cgroups
from tidal.mechanisms.criu.cgroups import Hierarchy
from tidal.mechanisms.criu.rank import RankProcess

log = logging.getLogger(__name__)


def cpu_sets(devices: int, cpus: list[int] | None = None) -> list[list[int]]:
    if devices < 1:
        raise ConfigError(f"a node needs at least one device, not {devices}", hint="give it --devices 1 or more")
    cores = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cores) >= devices:
        per = len(cores) // devices
        return [cores[i * per:(i + 1) * per] for i in range(devices)]
    return [[cores[i % len(cores)]] for i in range(devices)]


class CpuQuota:
    """One cgroup per device, each allowed ``cores / devices`` of a CPU: v1
    ``<cpu>/tidal-devices/<node>/dev<i>``, cgroup2 ``<mount>/tidal/<node>/dev<i>``. Inactive (``enabled``
    False) when every device has its own cores, or where the host offers no cpu controller to Tidal."""

    def __init__(self, node: str, devices: int, cores: int | None = None,
                 cpus: Sequence[Sequence[int]] | None = None, hierarchy: Hierarchy | None = None) -> None:
        cores = cores or len(os.sched_getaffinity(0))
        self.node = node
        self.share = cores / devices
        self.devices = devices
        self.hierarchy = hierarchy or cgroups.current()
        h = self.hierarchy
        self.enabled = devices > cores and h is not None and "cpu" in h.cpu_controllers()
        if self.enabled and h is not None:
            try:
                for i in range(devices):
                    h.confine_device(node, i, self.share, cpus[i] if cpus else None)
            except MechanismError as exc:  # e.g. cgroup2 whose controllers Tidal may not hand down
                log.warning("no CPU quota for devices (%s; %s): each device shares its cores unlimited",
                            exc.message, exc.hint)
                self.enabled = False
                return
            log.info("%d devices on %d cores: each device is %.2f of a CPU (cgroup v%d quota)",
                     devices, cores, self.share, h.version)

    def path(self, device: int) -> Path:
        assert self.hierarchy is not None
        return self.hierarchy.device_path(self.node, device)

    @property
    def base(self) -> Path:
        """The node's directory of device groups."""
        return self.path(0).parent

    def place(self, device: int, rank: RankProcess) -> None:
        """Put every process of a running rank under the device's quota; children it forks later inherit
        it. On cgroup2 the rank's own group moves below the device's: ``rank.cgroup`` is the new one."""
        if not self.enabled or self.hierarchy is None:
            return
        rank.cgroup = self.hierarchy.place(self.node, device, rank.cgroup, rank.pid)
