"""The cut over every communicator, on a model of the ranks: programs made of collectives on random
sub-groups and point-to-point operations, run in random interleavings, cut at random moments. The cut
always ends (every rank parked, no op in flight), is consistent (every member of each communicator
issued the same number of ops) and the programs then run to their end. Without the raised targets, the
same protocol can wait for ever (the last test shows such a program)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.core.cutplan import Need, Plan, Report, mismatches

Op = tuple[str, list[int]]  # (communicator, its members)


def programs(world: int, events: list[tuple[str, tuple[int, ...]]]) -> list[list[Op]]:
    """Each rank's program: its part of one global sequence of events (so plain ``torchrun`` runs it to
    the end). ``("c", ranks)``: a collective of the group of ``ranks``; ``("p", (a, b, tag))``: a sends to b."""
    progs: list[list[Op]] = [[] for _ in range(world)]
    for kind, arg in events:
        if kind == "c":
            key, members = "g" + "-".join(map(str, sorted(arg))), sorted(arg)
            for r in members:
                progs[r].append((key, members))
        else:
            a, b, tag = arg
            key = f"world:{a}>{b}:{tag}"
            progs[a].append((key, [a, b]))
            progs[b].append((key, [a, b]))
    return progs


@dataclass
class Model:
    """Ranks that block in each op until every member has issued it (the hardest case for the cut: gloo's
    asynchronous ops only block less), a gate per communicator and the need rule of the interposer."""

    progs: list[list[Op]]
    pc: list[int] = field(default_factory=list)
    issued: list[dict[str, int]] = field(default_factory=list)
    plan: Plan | None = None
    pending: bool = False
    raises: bool = True

    def __post_init__(self) -> None:
        self.pc = [0] * len(self.progs)
        self.issued = [{} for _ in self.progs]

    def blocked_in_op(self, r: int) -> bool:
        """Rank r has issued its last op and not every member has issued it yet."""
        if self.pc[r] == 0:
            return False
        key, members = self.progs[r][self.pc[r] - 1]
        n = self.issued[r][key]
        return any(self.issued[m].get(key, 0) < n for m in members)

    def at_targets(self, r: int) -> bool:
        assert self.plan is not None
        t = self.plan.targets
        return all(self.issued[r].get(k, 0) == n for k, n in t.items() if r in self.plan.members[k])

    def step(self, r: int) -> bool:
        """Let rank r move if it can; True if anything changed."""
        if self.pc[r] >= len(self.progs[r]) or self.blocked_in_op(r):
            return False
        key, members = self.progs[r][self.pc[r]]
        if self.pending:
            if self.plan is None:
                return False  # at the gate until the targets are known
            if self.issued[r].get(key, 0) >= self.plan.targets.get(key, 0):
                if self.raises and not self.at_targets(r):
                    return self.plan.need(key, members, self.issued[r].get(key, 0) + 1)
                return False
        self.issued[r][key] = self.issued[r].get(key, 0) + 1
        self.pc[r] += 1
        return True

    def run(self, rng: random.Random, moves: int | None = None) -> int:
        """Random interleaving until nothing moves (or ``moves`` moves); the moves made."""
        done = 0
        while moves is None or done < moves:
            ready = [r for r in range(len(self.progs)) if self.step_possible(r)]
            if not ready:
                return done
            self.step(rng.choice(ready))
            done += 1
        return done

    def step_possible(self, r: int) -> bool:
        # A dry run of step() on a copy of the little state it changes.
        pc, issued = list(self.pc), [dict(i) for i in self.issued]
        plan = None if self.plan is None else Plan(dict(self.plan.targets), dict(self.plan.members), self.plan.version)
        moved = self.step(r)
        self.pc, self.issued = pc, issued
        if plan is not None:
            self.plan = plan
        return moved

    def cut(self) -> None:
        self.pending = True
        reports = []
        for r in range(len(self.progs)):
            members = {k: m for k, m in self.progs[r]}
            reports.append({k: (n, members[k]) for k, n in self.issued[r].items()})
        self.plan = Plan.from_counts(reports)

    def resume(self) -> None:
        self.pending, self.plan = False, None


events_st = st.lists(
    st.one_of(
        st.tuples(st.just("c"), st.sampled_from([(0, 1, 2, 3), (0, 2), (1, 3), (0, 1), (2, 3), (1, 2), (0, 3)])),
        st.tuples(st.just("p"), st.sampled_from([(a, b, t) for a in range(4) for b in range(4) if a != b
                                                 for t in (0, 1)])),
    ),
    min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(events=events_st, seed=st.integers(0, 2**32 - 1), fraction=st.floats(0, 1))
def test_the_cut_ends_consistent_at_any_moment_and_the_job_then_finishes(events: list, seed: int,
                                                                          fraction: float) -> None:
    progs = programs(4, events)
    rng = random.Random(seed)
    m = Model(progs)
    total = sum(len(p) for p in progs)
    m.run(rng, moves=int(fraction * total))
    m.cut()
    m.run(rng)
    # Parked: every rank at its targets, none inside an op; the same count on every communicator.
    assert all(m.at_targets(r) and not m.blocked_in_op(r) for r in range(4))
    assert mismatches(dict(enumerate(m.issued)), m.plan.members if m.plan else {}) == []
    # Never beyond what the programs hold (the raises stay within the closure of the first counts).
    assert all(m.pc[r] <= len(progs[r]) for r in range(4))
    m.resume()
    m.run(rng)
    assert m.pc == [len(p) for p in progs]


@pytest.mark.parametrize("seed", range(200))
def test_seeded_random_cut_moments_on_a_training_loop(seed: int) -> None:
    # The loop of the system tests' script, 5 steps: pair groups, a ring of sends, 2-D mesh dimensions.
    step = [("c", (0, 2)), ("c", (1, 3)), ("p", (0, 1, 0)), ("p", (2, 3, 0)), ("p", (1, 2, 0)), ("p", (3, 0, 0)),
            ("c", (0, 1)), ("c", (2, 3)), ("c", (0, 1, 2, 3))]
    progs = programs(4, step * 5)
    rng = random.Random(seed)
    m = Model(progs)
    m.run(rng, moves=rng.randrange(sum(len(p) for p in progs)))
    m.cut()
    m.run(rng)
    assert all(m.at_targets(r) and not m.blocked_in_op(r) for r in range(4))
    m.resume()
    m.run(rng)
    assert m.pc == [len(p) for p in progs]


def test_without_raised_targets_a_cut_can_wait_for_ever() -> None:
    # Rank 1 must issue on group {1, 2} before it can answer rank 0 on group {0, 1}; rank 2 had not reached
    # {1, 2} at the cut, so its target there is 0: rank 0 would wait in {0, 1} for ever.
    progs = programs(3, [("c", (1, 2)), ("c", (0, 1))])
    for raises in (False, True):
        m = Model(progs, raises=raises)
        m.pc[0], m.issued[0] = 1, {"g0-1": 1}  # rank 0 is inside its collective on {0, 1}
        m.cut()
        m.run(random.Random(0))
        assert m.blocked_in_op(0) is (not raises)
        if raises:
            assert m.plan is not None and m.plan.targets == {"g0-1": 1, "g1-2": 1}


def test_a_need_within_the_target_raises_nothing() -> None:
    plan = Plan.from_counts([{"g": (3, [0, 1])}, {"g": (2, [0, 1])}])
    assert plan.targets == {"g": 3} and plan.version == 0
    assert not plan.need("g", [0, 1], 3)
    assert plan.need("h", [1, 2], 1) and plan.version == 1 and plan.members["h"] == [1, 2]


@dataclass
class Spread(Model):
    """The same ranks spread over nodes, cut as over several nodes: each node reports its ranks' counts
    (:class:`Report`), the coordinator builds the plan from the reports and sends it to every node in
    rounds; a rank's need goes into its node's answer (not into the plan), and the first answer with
    needs raises the plan and starts the next round on every node at once. Nodes' answers and ranks'
    moves interleave at random."""

    node_of: list[int] = field(default_factory=list)
    views: dict[int, Plan] = field(default_factory=dict)  # each node's round: the targets it was sent
    needs: dict[int, dict[str, Need]] = field(default_factory=dict)
    rounds: int = 0

    def view(self, r: int) -> Plan:
        return self.views[self.node_of[r]]

    def at_targets(self, r: int) -> bool:
        t, members = self.view(r).targets, self.view(r).members
        return all(self.issued[r].get(k, 0) == n for k, n in t.items() if r in members[k])

    def step(self, r: int) -> bool:
        if self.pc[r] >= len(self.progs[r]) or self.blocked_in_op(r):
            return False
        key, members = self.progs[r][self.pc[r]]
        if self.pending:
            if not self.views:
                return False
            if self.issued[r].get(key, 0) >= self.view(r).targets.get(key, 0):
                mine = self.needs.setdefault(self.node_of[r], {})
                count = self.issued[r].get(key, 0) + 1
                if not self.at_targets(r) and key not in mine:
                    mine[key] = Need(key, tuple(members), count)
                    return True
                return False
        self.issued[r][key] = self.issued[r].get(key, 0) + 1
        self.pc[r] += 1
        return True

    def step_possible(self, r: int) -> bool:
        pc, issued = list(self.pc), [dict(i) for i in self.issued]
        needs = {n: dict(v) for n, v in self.needs.items()}
        moved = self.step(r)
        self.pc, self.issued, self.needs = pc, issued, needs
        return moved

    def cut(self) -> None:
        self.pending = True
        reports: dict[int, Report] = {}
        for r in range(len(self.progs)):
            members = {k: m for k, m in self.progs[r]}
            reports.setdefault(self.node_of[r], Report()).add(
                str(r), {k: (n, members[k]) for k, n in self.issued[r].items()}, None)
        self.plan = Plan.from_counts(rep.comms for rep in reports.values())
        self.new_round()

    def new_round(self) -> None:
        assert self.plan is not None
        self.rounds += 1
        self.views = {n: Plan.from_message(self.plan.message()) for n in set(self.node_of)}
        self.needs = {}

    def answer(self, node: int) -> None:
        """Node ``node`` answers its round with the needs its ranks raised."""
        assert self.plan is not None
        if self.plan.raise_for(self.needs.get(node, {}).values()):
            self.new_round()
        else:
            self.needs.pop(node, None)

    def run_spread(self, rng: random.Random) -> None:
        while True:
            ready = [r for r in range(len(self.progs)) if self.step_possible(r)]
            answering = [n for n, v in self.needs.items() if v]
            if not ready and not answering:
                return
            if answering and (not ready or rng.random() < 0.3):
                self.answer(rng.choice(answering))
            else:
                self.step(rng.choice(ready))

    def resume(self) -> None:
        super().resume()
        self.views, self.needs = {}, {}


@settings(max_examples=300, deadline=None)
@given(events=events_st, seed=st.integers(0, 2**32 - 1), fraction=st.floats(0, 1),
       nodes=st.sampled_from([[0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 2, 3], [0, 0, 0, 1]]))
def test_the_cut_over_several_nodes_ends_consistent_in_rounds(events: list, seed: int, fraction: float,
                                                              nodes: list[int]) -> None:
    progs = programs(4, events)
    rng = random.Random(seed)
    m = Spread(progs, node_of=nodes)
    m.run(rng, moves=int(fraction * sum(len(p) for p in progs)))
    m.cut()
    m.run_spread(rng)
    # Every node holds the last round's plan, every rank parked at it: the same count on every communicator.
    assert m.plan is not None and all(v.targets == m.plan.targets for v in m.views.values())
    assert all(m.at_targets(r) and not m.blocked_in_op(r) for r in range(4))
    assert mismatches(dict(enumerate(m.issued)), m.plan.members) == []
    m.resume()
    m.run(rng)
    assert m.pc == [len(p) for p in progs]


def test_a_need_on_one_node_raises_the_targets_of_the_others_in_a_second_round() -> None:
    # The program of the test above, rank 0 on one node, ranks 1 and 2 on another: rank 1 (node 1) needs
    # {1, 2} raised; rank 0 (node 0) waits inside {0, 1} meanwhile and never parks in the first round.
    progs = programs(3, [("c", (1, 2)), ("c", (0, 1))])
    m = Spread(progs, node_of=[0, 1, 1])
    m.pc[0], m.issued[0] = 1, {"g0-1": 1}
    m.cut()
    assert m.plan is not None and m.plan.targets == {"g0-1": 1}
    m.run_spread(random.Random(0))
    assert m.rounds == 2 and m.plan.targets == {"g0-1": 1, "g1-2": 1} and m.plan.version == 1
    assert all(m.at_targets(r) and not m.blocked_in_op(r) for r in range(3))


def test_a_node_report_keeps_the_largest_count_per_communicator_and_each_ranks_world_count() -> None:
    rep = Report()
    rep.add("0", {"w": (5, [0, 1, 2, 3]), "w:0>2:0": (2, [0, 2])}, "w")
    rep.add("1", {"w": (6, [0, 1, 2, 3]), "g": (1, [1, 3])}, "w")
    rep.add("2", {}, None)  # a rank that has not built its group yet
    assert rep.comms == {"w": (6, [0, 1, 2, 3]), "w:0>2:0": (2, [0, 2]), "g": (1, [1, 3])}
    assert rep.counts == {"0": 5, "1": 6, "2": 0} and rep.default == "w"


def test_a_plan_raised_by_a_nodes_needs_travels_as_its_message() -> None:
    plan = Plan.from_counts([{"w": (4, [0, 1, 2, 3])}, {"w": (5, [0, 1, 2, 3]), "g": (1, [1, 3])}])
    assert not plan.raise_for([Need("w", (0, 1, 2, 3), 5)])
    assert plan.raise_for([Need("w", (0, 1, 2, 3), 5), Need("h", (0, 2), 1)])
    assert plan.version == 1 and plan.target("w") == 5 and plan.target(None) == 0
    again = Plan.from_message(plan.message())
    assert (again.targets, again.members, again.version) == (plan.targets, plan.members, plan.version)
