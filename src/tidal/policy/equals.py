"""Ordering among equals: which running job of a waiting job's own tier it may take devices from.

Within a tier, least attained service goes first (Tiresias' 2D-LAS, discretised): a waiting job whose
service is below ``threshold`` device-seconds may preempt a running job of the same tier whose service
has reached it, as Tiresias' top queue preempts its lower queue. Unlike Tiresias the decision counts what
the preemption costs: the victim must have run since its last change for at least ``cost_ratio`` times
the pause a checkpoint and restore cost it (``pause_s``), and ``min_run_s`` in any case, so that a job is
never preempted more often than the work it keeps justifies.
"""

from __future__ import annotations


def las_level(service: float, threshold: float) -> int:
    """0 for jobs below ``threshold`` device-seconds of service (served first), 1 above."""
    return 0 if service < threshold else 1


def may_preempt_equal(
    waiting_service: float,
    victim_service: float,
    victim_ran_s: float,
    *,
    threshold: float,
    pause_s: float,
    cost_ratio: float,
    min_run_s: float,
) -> bool:
    """Whether a waiting job may preempt a running job of its own tier (pure: the policy's rule)."""
    if las_level(waiting_service, threshold) >= las_level(victim_service, threshold):
        return False
    return victim_ran_s >= max(min_run_s, cost_ratio * pause_s)
