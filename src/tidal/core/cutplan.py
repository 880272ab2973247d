"""The coordinator's side of the consistent cut over every communicator of a job (pure).

A *communicator* is a sequence of ops that must be matched across its members: a process group's
collectives, or one direction of a point-to-point pair with one tag (the sender's sends, the receiver's
receives). Each rank reports, per communicator it has used, how many ops it has announced. The first
targets are the largest count per communicator; a rank that is held at its target on one communicator
while it still owes ops on another asks for one more op there (a *need*), and the target is raised. The
argument for why this ends, and ends consistent, is in docs/distributed.md; tests/unit/core/test_cutplan.py
checks it on a model of the ranks.

Over several nodes the same plan is kept by the control plane: each node reports its ranks' counts
(:class:`Report`), the plan is built from all of them, and each park round sends its targets to every node;
a node answers with the needs its ranks raised (:class:`Need`), which :meth:`Plan.raise_for` applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Need:
    """A rank held at the target of ``key`` while it owes ops elsewhere needs ``count`` ops there."""

    key: str
    members: tuple[int, ...]
    count: int


@dataclass
class Report:
    """What one node's ranks announced at a cut: per communicator, the most ops any of them announced and
    the communicator's members; ``counts``: each rank's count on the world group (``default``)."""

    comms: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    default: str | None = None

    def add(self, rank: str, comms: Mapping[str, tuple[int, Sequence[int]]], default: str | None) -> None:
        """The counts of one rank (``comms``: communicator → (ops announced, members))."""
        for key, (count, members) in comms.items():
            before = self.comms.get(key)
            self.comms[key] = (max(int(count), before[0] if before else 0),
                               before[1] if before else sorted(int(m) for m in members))
        self.default = self.default or default
        self.counts[rank] = int(comms[default][0]) if default and default in comms else 0


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

    def raise_for(self, needs: Iterable[Need]) -> bool:
        """Apply needs reported by a node; True if any raised a target (the plan has a new version)."""
        raised = False
        for n in needs:
            raised = self.need(n.key, n.members, n.count) or raised
        return raised

    def target(self, default: str | None) -> int:
        """The world group's target (0 when no rank reported one)."""
        return self.targets.get(default, 0) if default else 0

    @classmethod
    def from_message(cls, msg: Mapping[str, object]) -> Plan:
        """The plan :meth:`message` described (as stored or sent)."""
        targets = msg.get("targets") or {}
        members = msg.get("members") or {}
        assert isinstance(targets, Mapping) and isinstance(members, Mapping)
        version = msg.get("version") or 0
        assert isinstance(version, int)
        return cls({str(k): int(v) for k, v in targets.items()},
                   {str(k): sorted(int(m) for m in v) for k, v in members.items()}, version)

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
