"""First-fit: the live cluster's first scheduling policy, behind the same ``decide`` interface as the
full policy (DESIGN.md §4), so that it is replaced rather than rewritten.

Stateless: every call reads the whole view (the last view and decision are kept only to say why jobs
wait, :meth:`FirstFitPolicy.reasons`). Waiting jobs (pending, or preempted and not held) are taken by
tier (premium first) then submission order and placed, all ranks on one node, on the node with the
fewest free devices that still fits them (best fit keeps whole nodes for large gangs); a job larger than
any node fills the emptiest nodes one after the other. A premium or
standard job that does not fit preempts running basic jobs (checkpoint, never kill), newest first, on the
node where the fewest must go. Devices that preemptions will free are set aside for the job that asked
for them, so nothing else takes them and no more jobs are preempted than needed. A drained node
(``ClusterView.drained``) is never chosen, nor are its jobs preempted to make room there; they run on. A job whose
owner, or whose project, would then hold more devices than its cap (``ClusterView.device_caps``,
``ClusterView.project_caps``) waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidal.core import Action, ActionKind, ClusterView, DeviceRef, Event, JobState, JobView, Tier, Topology, rank_map
from tidal.policy.device_cap import held_by_owner, held_by_project
from tidal.policy.reasons import Need, Reason, explain

WAITING = frozenset({JobState.PENDING, JobState.PREEMPTED})


class FirstFitPolicy:
    name = "firstfit"
    grows = False  # it places whole jobs and never resizes one

    def __init__(self) -> None:
        self._n = 0
        self._view: ClusterView | None = None
        self._out: list[Action] = []
        self._room_for: set[str] = set()  # jobs for which basic jobs are being (or were just) preempted

    def next_wakeup(self, now: float) -> float | None:
        return None

    def reasons(self) -> Mapping[str, Reason]:
        if self._view is None:
            return {}
        biggest = max((n.devices for n in self._view.topology.nodes()), default=0)

        def need(j: JobView) -> Need:
            return Need(j.max_d, ("all of them, on one node" if j.max_d > 1 else "") if j.max_d <= biggest
                        else "all of them")

        return explain(self._view, self._out, need, room_for=self._room_for, cap_need=lambda j: j.max_d)

    def decide(self, view: ClusterView, events: Sequence[Event], now: float) -> list[Action]:
        self._view, self._room_for = view, set()
        self._out = self._decide(view, events)
        return self._out

    def _decide(self, view: ClusterView, events: Sequence[Event]) -> list[Action]:
        cause = events[-1].id if events else None
        free: dict[str, list[int]] = {n.name: list(range(n.devices)) for n in view.topology.nodes()}
        draining: dict[str, list[int]] = {n: [] for n in free}  # held by basic jobs being checkpointed
        running_basic: dict[str, list[JobView]] = {n: [] for n in free}
        for j in view.jobs.values():
            if j.state in WAITING:
                continue
            for d in j.devices:
                if d.node in free and d.index in free[d.node]:
                    free[d.node].remove(d.index)
                    if j.state is JobState.CHECKPOINTING and j.tier is Tier.BASIC:
                        draining[d.node].append(d.index)
            if j.state is JobState.RUNNING and j.tier is Tier.BASIC and j.devices:
                running_basic[j.devices[0].node].append(j)
        waiting = sorted((j for j in view.jobs.values() if j.state in WAITING),
                         key=lambda j: (-j.tier.rank, j.submitted_at, j.id))
        out: list[Action] = []
        topo = view.topology
        caps, project_caps = view.device_caps, view.project_caps
        held = held_by_owner(view) if caps else {}
        project_held = held_by_project(view) if project_caps else {}
        for j in waiting:
            need = j.max_d
            cap = caps.get(j.owner)
            if cap is not None and held.get(j.owner, 0) + need > cap:
                continue  # its owner would hold more than their cap
            project_cap = project_caps.get(j.project)
            if project_cap is not None and project_held.get(j.project, 0) + need > project_cap:
                continue  # its project would hold more than its cap
            # A job pinned to a cluster or region (tidal submit --cluster/--region) sees only its nodes.
            inside = {n: idx for n, idx in free.items() if n not in view.drained and _within_pins(topo, j, n)}
            node = _best_fit(inside, need)
            devs = []
            if node is not None:
                devs = [DeviceRef(node, i) for i in free[node][:need]]
                del free[node][:need]
            elif need > max((topo.node(n).devices for n in inside), default=0):
                devs = _spread(inside, need)  # larger than any node: fill nodes one after the other
            if devs:
                if cap is not None:
                    held[j.owner] = held.get(j.owner, 0) + len(devs)
                if project_cap is not None:
                    project_held[j.project] = project_held.get(j.project, 0) + len(devs)
                kind = ActionKind.RESUME if j.state is JobState.PREEMPTED else ActionKind.PLACE
                out.append(self._action(kind, j, devs, cause, "fits"))
                continue
            if j.tier is Tier.BASIC:
                continue
            # Room already being freed for it (an earlier decision's preemptions)? Then wait for it.
            soon = _best_fit({n: free[n] + draining[n] for n in inside}, need)
            if soon is not None:
                free[soon] = []
                draining[soon] = []
                self._room_for.add(j.id)
                continue
            victims_at = _cheapest_victims(inside, {n: running_basic[n] for n in inside}, need)
            if victims_at is None:
                continue
            node, victims = victims_at
            self._room_for.add(j.id)
            for v in victims:
                why = f"make room for {j.tier.value} job {j.id}"
                out.append(self._action(ActionKind.PREEMPT, v, [], cause, why))
                running_basic[node].remove(v)
            free[node] = []  # set aside for j
            draining[node] = []
        return out

    def _action(self, kind: ActionKind, j: JobView, devs: list[DeviceRef], cause: str | None,
                reason: str) -> Action:
        self._n += 1
        return Action(id=f"{self.name}-{self._n}", kind=kind, job_id=j.id,
                      placement=rank_map(tuple(devs), j.ranks) if devs else (), cause=cause, reason=reason)


def _within_pins(topo: Topology, j: JobView, node: str) -> bool:
    cluster = topo.cluster_of(node)
    return j.home_cluster in (None, cluster) and j.home_region in (None, topo.region_of(cluster))


def _spread(free: dict[str, list[int]], need: int) -> list[DeviceRef]:
    """Devices on as few nodes as possible (the emptiest first), or [] when they do not suffice."""
    if sum(len(v) for v in free.values()) < need:
        return []
    devs: list[DeviceRef] = []
    for n in sorted(free, key=lambda n: (-len(free[n]), n)):
        take = free[n][: need - len(devs)]
        devs += [DeviceRef(n, i) for i in take]
        del free[n][: len(take)]
        if len(devs) == need:
            break
    return devs


def _best_fit(free: dict[str, list[int]], need: int) -> str | None:
    fits = [(len(idx), n) for n, idx in free.items() if len(idx) >= need]
    return min(fits)[1] if fits else None


def _cheapest_victims(free: dict[str, list[int]], running_basic: dict[str, list[JobView]],
                      need: int) -> tuple[str, list[JobView]] | None:
    best: tuple[int, str, list[JobView]] | None = None
    for node, jobs in running_basic.items():
        have = len(free[node])
        chosen: list[JobView] = []
        # Newest first: they lose the least progress to the restore's cost and have had their turn least.
        for v in sorted(jobs, key=lambda v: (-(v.started_at or 0.0), v.id)):
            if have >= need:
                break
            chosen.append(v)
            have += len(v.devices)
        if have >= need and chosen and (best is None or len(chosen) < best[0]):
            best = (len(chosen), node, chosen)
    return None if best is None else (best[1], best[2])
