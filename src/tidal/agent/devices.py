"""Virtual devices on a machine without GPUs: each device is a real share of the CPUs.

With at least as many usable cores as devices, a device is a disjoint CPU set. With fewer cores, the
devices share cores round-robin (a CPU-quota per device through the cgroup v1 cpu controller is the
planned refinement, see docs/cluster.md)."""

from __future__ import annotations

import os


def cpu_sets(devices: int, cpus: list[int] | None = None) -> list[list[int]]:
    if devices < 1:
        raise ValueError("a node needs at least one device")
    cores = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cores) >= devices:
        per = len(cores) // devices
        return [cores[i * per:(i + 1) * per] for i in range(devices)]
    return [[cores[i % len(cores)]] for i in range(devices)]
