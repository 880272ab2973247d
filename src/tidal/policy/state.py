"""The policy's own incremental indexes of the cluster, kept between ``decide`` calls.

Built once from a :class:`ClusterView`, then updated from events and from the policy's own actions
(assumed to succeed, as the Kubernetes scheduler's cache does; a failed action makes the policy
rebuild from the next view). Everything a decision needs is O(1) or O(devices per node) to find:
free devices per node, nodes bucketed by their free-device count per cluster, devices held per tier.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidal.core import ClusterView, DeviceRef, JobState, JobView, Tier

RUNNING_STATES = frozenset(
    {JobState.RUNNING, JobState.CHECKPOINTING, JobState.MIGRATING, JobState.RESIZING, JobState.RESTORING}
)
WAITING_STATES = frozenset({JobState.PENDING, JobState.PREEMPTED})


_NO_DEVICES: list[DeviceRef] = []


class JobRec:
    """The policy's record of one live job (pending or holding devices)."""

    __slots__ = (
        "W",
        "attained",
        "devices",
        "duration",
        "hi",
        "home",
        "home_region",
        "id",
        "image_gb",
        "last_change",
        "last_cluster",
        "lo",
        "moves",
        "owner",
        "preemptions",
        "project",
        "remaining",
        "running",
        "seq",
        "shared",
        "started_at",
        "submit",
        "tier",
        "tier_obj",
    )

    def __init__(self, jv: JobView, seq: int, tierless: bool = False) -> None:
        self.id = jv.id
        self.W = jv.ranks
        self.lo = jv.min_devices
        self.hi = jv.max_d
        self.tier_obj: Tier = jv.tier
        self.tier = 0 if tierless else jv.tier.rank  # tier-blind baselines see every job alike
        self.project = jv.project
        self.owner = jv.owner
        self.submit = jv.submitted_at
        self.seq = seq
        self.home = jv.home_cluster
        self.home_region = jv.home_region
        self.last_cluster = jv.last_cluster
        self.image_gb = jv.image_gb  # its checkpoint image, GB (None: unknown)
        self.devices: list[DeviceRef] = _NO_DEVICES  # shared while waiting (never mutated): fewer objects
        self.started_at = jv.started_at if jv.started_at is not None else 0.0
        self.last_change = self.started_at  # last start, resume, migration or resize
        self.attained = jv.attained_device_s
        self.running = False
        self.shared = False  # time-sliced with another job on the same devices
        self.duration = jv.duration_hint
        self.remaining = jv.remaining_hint if jv.remaining_hint is not None else jv.duration_hint
        # A job seen preempted has been disturbed before: its next run is protected (anti-loop).
        self.preemptions = 1 if jv.state is JobState.PREEMPTED else 0
        self.moves = 0  # migrations and resizes

    def service(self, now: float) -> float:
        """Attained service in device-seconds (2D-LAS: devices × time)."""
        if self.running:
            return self.attained + len(self.devices) * (now - self.started_at)
        return self.attained

    def remaining_at(self, now: float) -> float:
        """Oracle remaining run time (SRTF), assuming full-rate progress since the last start."""
        rem = self.remaining if self.remaining is not None else float("inf")
        if self.running:
            d = len(self.devices)
            rem -= (now - self.started_at) / -(-self.W // d)  # replica splicing: ceil(W/D) ranks a device
        return max(rem, 0.0)

    def __repr__(self) -> str:
        return f"JobRec({self.id}, W={self.W}, tier={self.tier}, running={self.running}, d={len(self.devices)})"


class SchedState:
    def __init__(self, view: ClusterView, *, tierless: bool = False) -> None:
        topo = view.topology
        self.tierless = tierless
        self.topology = topo
        self.node_cluster: dict[str, str] = {}
        self.cluster_region: dict[str, str] = {}
        self.cluster_m: dict[str, int] = {}
        self.node_size: dict[str, int] = {}
        self.load: dict[str, list[int]] = {}
        self.free_idx: dict[str, list[int]] = {}
        self.buckets: dict[str, list[dict[str, None]]] = {}
        self.cluster_free: dict[str, int] = {}
        self.node_jobs: dict[str, dict[str, None]] = {}
        self.node_tier: dict[str, list[int]] = {}  # devices held per tier on the node (shared counted twice)
        self.tier_devices = [0, 0, 0]
        # room[t][cluster][v]: nodes where free devices plus those held by tiers below t number v
        # (t = 1, 2): where a standard or premium job could make room by preemption, found in O(1).
        self.room: list[dict[str, list[dict[str, None]]]] = [{}, {}, {}]
        self._room_of: list[dict[str, int]] = [{}, {}, {}]
        self.free_total = 0
        self.capacity = 0
        # Nodes hidden from placement: drained (the view's), failed (a node_down event), or hidden for a while
        # within a decision (reservations, defragmentation). Only the last come back with node_up.
        self.down: set[str] = set()
        self.drained: set[str] = set()
        self.failed: set[str] = set()
        self.jobs: dict[str, JobRec] = {}
        self.pending: dict[str, JobRec] = {}
        self.running: dict[str, JobRec] = {}
        self.usage: dict[str, int] = {}  # devices held per project
        self.owner_usage: dict[str, int] = {}  # devices held per user (every project and tier)
        self._seq = 0
        self.cluster_names = [c.name for c in topo.clusters()]
        room1, room2 = self.room[1], self.room[2]
        rof1, rof2 = self._room_of[1], self._room_of[2]
        for region in topo.regions:
            for c in region.clusters:
                m = c.devices_per_node
                cn = c.name
                self.cluster_m[cn] = m
                self.cluster_region[cn] = region.name
                buckets = self.buckets[cn] = [{} for _ in range(m + 1)]
                r1 = room1[cn] = [{} for _ in range(m + 1)]
                r2 = room2[cn] = [{} for _ in range(m + 1)]
                total = 0
                for n in c.nodes:
                    name, size = n.name, n.devices
                    self.node_cluster[name] = cn
                    self.node_size[name] = size
                    self.load[name] = [0] * size
                    self.free_idx[name] = list(range(size))
                    buckets[size][name] = None
                    self.node_jobs[name] = {}
                    self.node_tier[name] = [0, 0, 0]
                    v = size if size < m else m
                    r1[v][name] = None
                    r2[v][name] = None
                    rof1[name] = rof2[name] = v
                    total += size
                self.cluster_free[cn] = total
                self.free_total += total
                self.capacity += total
        # Jobs in arrival order, so that rebuilding gives the same order as incremental updates.
        waiting = (JobState.PENDING, JobState.PREEMPTED)
        holding: list[tuple[JobRec, tuple[DeviceRef, ...]]] = []
        for jv in sorted(view.jobs.values(), key=lambda j: (j.submitted_at, j.id)):
            state = jv.state
            if state is waiting[0] or state is waiting[1]:
                self.add_pending(jv)
            elif state in RUNNING_STATES and jv.placement:
                holding.append((self._new_rec(jv), jv.devices))
        self._allocate_all(holding)
        self.set_drained(view.drained)

    def _allocate_all(self, holding: list[tuple[JobRec, tuple[DeviceRef, ...]]]) -> None:
        """``allocate`` for every job holding devices in a fresh state, in one pass: the same indexes,
        dictionaries in the same order (nodes sit in a bucket in the order they entered it), without
        moving a node between buckets once per job."""
        moved: dict[str, int] = {}  # node → when it last changed bucket
        moved_room: list[dict[str, int]] = [{}, {}, {}]
        stamp = 0
        load_of, free_of, node_jobs, node_tier = self.load, self.free_idx, self.node_jobs, self.node_tier
        size_of, room_of = self.node_size, self._room_of
        tier_devices, usage, running = self.tier_devices, self.usage, self.running
        owner_usage = self.owner_usage
        taken = 0
        room1, room2 = room_of[1], room_of[2]
        moved1, moved2 = moved_room[1], moved_room[2]
        for rec, devices in holding:
            t = rec.tier
            rid = rec.id
            nodes: dict[str, None] = {}
            shared = False
            for d in devices:
                node = d.node
                load = load_of[node]
                i = d.index
                k = load[i]
                if k == 0:
                    taken += 1
                    moved[node] = stamp = stamp + 1
                else:
                    shared = True  # held already by an earlier job: time-sliced
                load[i] = k + 1
                node_tier[node][t] += 1
                nodes[node] = None
            for node in nodes:
                node_jobs[node][rid] = None
                load = load_of[node]
                free = load.count(0)
                size = size_of[node]
                nt = node_tier[node]
                below = free + nt[0]
                v1 = size if size < below else below
                below += nt[1]
                v2 = size if size < below else below
                if v1 != room1[node]:
                    room1[node] = v1
                    moved1[node] = stamp = stamp + 1
                if v2 != room2[node]:
                    room2[node] = v2
                    moved2[node] = stamp = stamp + 1
            tier_devices[t] += len(devices)
            usage[rec.project] = usage.get(rec.project, 0) + len(devices)
            owner_usage[rec.owner] = owner_usage.get(rec.owner, 0) + len(devices)
            rec.running = True
            running[rid] = rec
            rec.devices = list(devices)
            rec.shared = shared
        if not holding:
            return
        self.free_total -= taken
        for node in moved:
            free_of[node] = [i for i, x in enumerate(load_of[node]) if x == 0]
            self.cluster_free[self.node_cluster[node]] -= size_of[node] - len(free_of[node])
        # Nodes that never moved keep their place; the others follow in the order of their last move.
        for node, _ in sorted(moved.items(), key=lambda kv: kv[1]):
            b = self.buckets[self.node_cluster[node]]
            del b[size_of[node]][node]
            b[len(free_of[node])][node] = None
        for t in (1, 2):
            for node, _ in sorted(moved_room[t].items(), key=lambda kv: kv[1]):
                b = self.room[t][self.node_cluster[node]]
                del b[size_of[node]][node]
                b[room_of[t][node]][node] = None

    # ---- jobs -------------------------------------------------------------------------------------
    def _new_rec(self, jv: JobView) -> JobRec:
        rec = JobRec(jv, self._seq, self.tierless)
        self._seq += 1
        self.jobs[rec.id] = rec
        return rec

    def add_pending(self, jv: JobView) -> JobRec:
        rec = self._new_rec(jv)
        self.pending[rec.id] = rec
        return rec

    def requeue(self, rec: JobRec) -> None:
        self.pending[rec.id] = rec

    def forget(self, job_id: str) -> JobRec | None:
        rec = self.jobs.pop(job_id, None)
        if rec is None:
            return None
        if rec.running:
            self.release(rec, rec.devices, now=0.0, account=False)
        self.pending.pop(job_id, None)
        return rec

    # ---- devices ----------------------------------------------------------------------------------
    def _move_bucket(self, node: str, old_free: int, new_free: int) -> None:
        if node in self.down:
            return
        b = self.buckets[self.node_cluster[node]]
        del b[old_free][node]
        b[new_free][node] = None

    def allocate(self, rec: JobRec, devices: list[DeviceRef], *, now: float) -> None:
        """Give ``devices`` (distinct) to ``rec`` in addition to what it holds."""
        by_node = _indices_by_node(devices)
        t = rec.tier
        rid = rec.id
        down = self.down
        for node, idxs in by_node.items():
            load = self.load[node]
            free = self.free_idx[node]
            before = len(free)
            for i in idxs:
                if load[i] == 0:
                    free.remove(i)
                load[i] += 1
            after = len(free)
            if after != before:
                self._move_bucket(node, before, after)
                if node not in down:
                    got = before - after
                    self.cluster_free[self.node_cluster[node]] -= got
                    self.free_total -= got
            self.node_jobs[node][rid] = None
            self.node_tier[node][t] += len(idxs)
            self._touch(node)
        self.tier_devices[t] += len(devices)
        self.usage[rec.project] = self.usage.get(rec.project, 0) + len(devices)
        self.owner_usage[rec.owner] = self.owner_usage.get(rec.owner, 0) + len(devices)
        if not rec.running:
            rec.running = True
            rec.started_at = now
            self.pending.pop(rid, None)
            self.running[rid] = rec
            rec.devices = list(devices)
        else:
            self.settle(rec, now)
            rec.devices.extend(devices)

    def settle(self, rec: JobRec, now: float) -> None:
        """Fold the service since ``started_at`` into the record before its devices change."""
        if rec.running and now > rec.started_at:
            if rec.remaining is not None:
                rec.remaining = rec.remaining_at(now)
            rec.attained = rec.service(now)
            rec.started_at = now

    def release(self, rec: JobRec, devices: list[DeviceRef], *, now: float, account: bool = True) -> None:
        """Take ``devices`` (a subset of what ``rec`` holds) back; releasing all of them stops the job."""
        if account and rec.running:
            self.settle(rec, now)
        t = rec.tier
        by_node = _indices_by_node(devices)
        down = self.down
        for node, idxs in by_node.items():
            load = self.load[node]
            free = self.free_idx[node]
            before = len(free)
            for i in idxs:
                load[i] -= 1
                if load[i] == 0:
                    free.append(i)
            free.sort()
            after = len(free)
            if after != before:
                self._move_bucket(node, before, after)
                if node not in down:
                    self.cluster_free[self.node_cluster[node]] += after - before
                    self.free_total += after - before
            self.node_tier[node][t] -= len(idxs)
            self._touch(node)
        node_jobs = self.node_jobs
        if len(devices) == len(rec.devices):  # all of them (distinct, a subset): the job stops
            rec.devices = []
            for node in by_node:
                node_jobs[node].pop(rec.id, None)
        else:
            gone = set(devices)
            rec.devices = [d for d in rec.devices if d not in gone]
            still = {d.node for d in rec.devices}
            for node in by_node:
                if node not in still:
                    node_jobs[node].pop(rec.id, None)
        self.tier_devices[t] -= len(devices)
        self.usage[rec.project] -= len(devices)
        self.owner_usage[rec.owner] -= len(devices)
        if not rec.devices:
            rec.running = False
            rec.shared = False
            self.running.pop(rec.id, None)

    def _touch(self, node: str) -> None:
        """Move ``node`` to its right room bucket for each tier (free devices plus those held below)."""
        if node in self.down:
            return
        free = len(self.free_idx[node])
        size = self.node_size[node]
        nt = self.node_tier[node]
        # Written out for tiers 1 and 2 rather than looped: this runs after every device change.
        below = free + nt[0]
        v = size if size < below else below
        room_of = self._room_of[1]
        old = room_of[node]
        if v != old:
            b = self.room[1][self.node_cluster[node]]
            del b[old][node]
            b[v][node] = None
            room_of[node] = v
        below += nt[1]
        v = size if size < below else below
        room_of = self._room_of[2]
        old = room_of[node]
        if v != old:
            b = self.room[2][self.node_cluster[node]]
            del b[old][node]
            b[v][node] = None
            room_of[node] = v

    def retier(self, rec: JobRec, tier: int) -> None:
        """Change the rank a job is served and preempted at (Tiresias: its queue), keeping the
        per-tier device counts right."""
        if tier == rec.tier:
            return
        if rec.running:
            nodes: dict[str, int] = {}
            for d in rec.devices:
                nodes[d.node] = nodes.get(d.node, 0) + 1
            for node, k in nodes.items():
                self.node_tier[node][rec.tier] -= k
                self.node_tier[node][tier] += k
                self._touch(node)
            self.tier_devices[rec.tier] -= len(rec.devices)
            self.tier_devices[tier] += len(rec.devices)
        rec.tier = tier

    def node_down(self, node: str) -> None:
        if node in self.down:
            return
        free = len(self.free_idx[node])
        c = self.node_cluster[node]
        del self.buckets[c][free][node]
        self.cluster_free[c] -= free
        self.free_total -= free
        self.capacity -= self.node_size[node]
        for t in (1, 2):
            del self.room[t][c][self._room_of[t][node]][node]
        self.down.add(node)

    def node_up(self, node: str) -> None:
        """Show ``node`` again, unless it is drained or failed: those stay hidden until undrained or back."""
        if node not in self.down or node in self.drained or node in self.failed:
            return
        self.down.discard(node)
        free = len(self.free_idx[node])
        c = self.node_cluster[node]
        for t in (1, 2):
            self.room[t][c][self._room_of[t][node]][node] = None
        self._touch(node)
        self.buckets[c][free][node] = None
        self.cluster_free[c] += free
        self.free_total += free
        self.capacity += self.node_size[node]


    def node_failed(self, node: str) -> None:
        """The node went down (an event): hidden until it is back."""
        if node in self.node_size:
            self.failed.add(node)
            self.node_down(node)

    def node_back(self, node: str) -> None:
        if node in self.failed:
            self.failed.discard(node)
            self.node_up(node)

    def set_drained(self, nodes: Iterable[str]) -> bool:
        """Drain exactly ``nodes`` (those of the topology): hidden from placement, growth and moves, while the
        jobs on them keep their devices. Whether a node came back (its free devices may start waiting jobs)."""
        want = {n for n in nodes if n in self.node_size}
        if want == self.drained:
            return False
        back = self.drained - want
        for node in want - self.drained:
            self.drained.add(node)
            self.node_down(node)
        for node in back:
            self.drained.discard(node)
            self.node_up(node)
        return bool(back)


def _indices_by_node(devices: Iterable[DeviceRef]) -> dict[str, list[int]]:
    """Device indices grouped by node, in the order given (no list made per device, as setdefault
    would: this runs on every grant and release)."""
    by_node: dict[str, list[int]] = {}
    for d in devices:
        idxs = by_node.get(d.node)
        if idxs is None:
            by_node[d.node] = [d.index]
        else:
            idxs.append(d.index)
    return by_node
