"""The coordinator's side of the consistent cut over every communicator of a job (pure).

A *communicator* is a sequence of ops that must be matched across its members: a process group's
collectives, or one direction of a point-to-point pair with one tag (the sender's sends, the receiver's
receives). Each rank reports, per communicator it has used, how many ops it has announced. The first
targets are the largest count per communicator; a rank that is held at its target on one communicator
while it still owes ops on another asks for one more op there (a *need*), and the target is raised. The
argument for why this ends, and ends consistent, is in docs/distributed.md; tests/unit/core/test_cutplan.py
checks it on a model of the ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class Plan:
    """Targets per communicator and who takes part in each; ``version`` grows with every raise."""

    targets: dict[str, int] = field(default_factory=dict)
    members: dict[str, list[int]] = field(default_factory=dict)
    version: int = 0

    @classmethod
    def from_counts(cls, reports: Iterable[Mapping[str, tuple[int, Sequence[int]]]]) -> Plan:
        """``reports``: per rank, communicator → (ops announced, its members' world ranks)."""
        plan = cls()
        for report in reports:
            for key, (count, members) in report.items():
                plan.targets[key] = max(plan.targets.get(key, 0), int(count))
                plan.members.setdefault(key, sorted(int(m) for m in members))
        return plan

    def need(self, key: str, members: Sequence[int], count: int) -> bool:
        """A rank needs ``count`` ops on ``key``; True if that raised the target (a new version)."""
        self.members.setdefault(key, sorted(int(m) for m in members))
        if count <= self.targets.get(key, 0):
            return False
        self.targets[key] = count
        self.version += 1
        return True

    def message(self) -> dict[str, object]:
        return {"targets": dict(self.targets), "members": {k: list(v) for k, v in self.members.items()},
                "version": self.version}


def mismatches(issued: Mapping[int, Mapping[str, int]], members: Mapping[str, Sequence[int]]) -> list[str]:
    """Communicators whose members did not all issue the same number of ops (empty: a consistent cut)."""
    bad = []
    for key, ms in sorted(members.items()):
        counts = {m: issued.get(m, {}).get(key, 0) for m in ms}
        if len(set(counts.values())) > 1:
            bad.append(f"{key}: {counts}")
    return bad
