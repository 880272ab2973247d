"""The messages between the control plane and its node agents: one typed, versioned model each.

Control plane → agent: an :class:`Action` wraps one order (:data:`Order`: launch, restore, cut, park,
checkpoint, finish, kill, prestage, unstage), chosen by its ``kind``. Agent → control plane: :class:`Register`,
:class:`Heartbeat`, :class:`ActionResult` (whose ``data`` is the order's typed result, :func:`result_of`),
:class:`ExitReport` and :class:`Leave`; a new node's agent first sends :class:`Join` (with a join token) for the
node's own credential. Every message carries the protocol version ``v``; both ends refuse
a version they do not speak (:class:`tidal.errors.ProtocolMismatch`), because a control plane and its
agents are upgraded at different times. Every field is bounded (:mod:`tidal.core.limits`): what arrives
over the network is validated before it is used, and an unknown field is an error, not ignored.

Encoding is one function each way: :func:`encode` (a model to JSON-ready data) and the ``decode_*``
functions (data to a model, or :class:`tidal.errors.ValidationError` naming the bad field). A versioned
message (an action, anything from an agent) checks its ``v`` before anything else, wherever it is
validated (``decode``, or the API's request bodies): another version is a ProtocolMismatch (HTTP 426).
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import pydantic
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    field_validator,
    model_validator,
)

from tidal.core import limits
from tidal.errors import InvalidField, ProtocolMismatch, ValidationError

#: The protocol this build speaks. Bump it on any change an older peer would misread.
VERSION = 1
#: The versions this build accepts from a peer.
ACCEPTED = frozenset({VERSION})

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Names of nodes, regions, clusters and agents: they end up in paths and log lines.
NodeName = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_NODE_NAME_CHARS)]
Ident = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_ID_CHARS)]
JobId = Annotated[str, StringConstraints(pattern=_NAME, max_length=32)]
# A Unix account name (POSIX portable, plus the '$' of machine accounts).
UnixName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?$",
                                            max_length=limits.MAX_ID_CHARS)]
Rank = Annotated[int, Field(ge=0, lt=limits.MAX_RANKS)]
Count = Annotated[int, Field(ge=0, lt=2**63)]
Int32 = Annotated[int, Field(ge=-(2**31), lt=2**31)]
Seconds = Annotated[float, Field(allow_inf_nan=False)]
Text = Annotated[str, StringConstraints(max_length=64 * 1024)]
Figure = Annotated[str, StringConstraints(max_length=limits.MAX_ID_CHARS)]
CheckpointId = Annotated[str, StringConstraints(pattern=_NAME, max_length=limits.MAX_ID_CHARS)]
Arg = Annotated[str, StringConstraints(max_length=limits.MAX_ARG_BYTES)]
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _address(text: str) -> str:
    """A host name or an IP address (v4, or v6 without brackets): where other nodes reach a node."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if len(text) <= 253 and all(_HOST_LABEL.match(label) for label in text.removesuffix(".").split(".")):
        return text
    raise InvalidField(f"{text[:300]!r} is neither an IP address nor a host name")


Address = Annotated[str, StringConstraints(max_length=253), AfterValidator(_address)]
CpuSet = Annotated[list[Annotated[int, Field(ge=0, le=limits.MAX_CPU_ID)]], Field(max_length=limits.MAX_CPU_ID + 1)]


def _printable(text: str | None) -> str | None:
    """Text as a database can store it: a lone surrogate (from an undecodable file name, say) is shown
    escaped rather than refusing a report the agent would otherwise retry."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode()


class Message(BaseModel):
    """A message's fields are exactly its model's: an unknown one is refused (a misspelt key is found at
    the first message, not at run time on a node)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _keys_as_text(cls, data: Any) -> Any:
        # A key that is not valid Unicode (a lone surrogate from a JSON escape) is shown escaped, so that its
        # refusal as an unknown field names it (pydantic cannot name the key itself).
        if isinstance(data, dict) and any(isinstance(k, str) and _printable(k) != k for k in data):
            return {_printable(k) if isinstance(k, str) else k: v for k, v in data.items()}
        return data


class _Versioned(Message):
    """A message that crosses the network on its own: its protocol version ``v`` is checked first (a missing
    one is this version's: peers older than the field spoke it)."""

    _what: ClassVar[str] = "this message"
    v: int = VERSION

    @model_validator(mode="before")
    @classmethod
    def _speaks_this_version(cls, data: Any) -> Any:
        check_version(data, cls._what.format(name=cls.__name__))
        return data


# -- control plane → agent --------------------------------------------------------------------------------
class Rendezvous(Message):
    """Where the ranks of a distributed job (re)build their torch.distributed group."""

    addr: Annotated[str, StringConstraints(max_length=limits.MAX_NODE_NAME_CHARS + 8)]
    prefix: Annotated[str, StringConstraints(max_length=256)]


class RankSlot(Message):
    """One rank of a launch or restore on this node."""

    rank: Rank
    local_rank: Rank
    device: Annotated[int, Field(ge=0, lt=limits.MAX_DEVICES_PER_NODE)]
    cpus: CpuSet | None = None


class CheckpointRef(Message):
    """A job checkpoint: its id and the store checkpoints holding its parts (one per node it spanned).
    ``source``: the checkpoint store of another region that holds it, when this node's store does not yet
    (the node replicates it from there first, only the chunks its store lacks)."""

    id: CheckpointId
    parts: Annotated[list[CheckpointId], Field(min_length=1, max_length=limits.MAX_RANKS)]
    source: Annotated[str, StringConstraints(max_length=limits.MAX_WORKDIR_BYTES)] | None = None


CommKey = Annotated[str, StringConstraints(min_length=1, max_length=limits.MAX_COMMUNICATOR_CHARS)]
Members = Annotated[list[Rank], Field(min_length=1, max_length=limits.MAX_RANKS)]
Targets = Annotated[dict[CommKey, Count], Field(max_length=limits.MAX_COMMUNICATORS)]


def _members_bounded(groups: Any) -> None:
    """All members of a cut's communicators together stay within MAX_CUT_MEMBERS."""
    if sum(len(m) for m in groups) > limits.MAX_CUT_MEMBERS:
        raise InvalidField(f"more than {limits.MAX_CUT_MEMBERS} members of communicators in all")


class Comm(Message):
    """A communicator at a cut: the most ops a rank of this node announced on it, and its members (world ranks)."""

    count: Count
    members: Members


class Need(Message):
    """A rank held at the target of communicator ``key`` while it owes ops elsewhere: it needs ``count`` there."""

    key: CommKey
    members: Members
    count: Count


class Cut(Message):
    """A consistent cut parked across nodes: its epoch and the world group's target (the collective every
    rank waits after); ``targets`` and ``version``: the targets per communicator every rank parked at."""

    epoch: Count
    target: Count
    targets: Targets | None = None
    version: Count = 0


class _JobOrder(Message):
    job_id: JobId
    attempt: Annotated[int, Field(ge=0, lt=2**31)]


class _Start(_JobOrder):
    argv: Annotated[list[Arg], Field(min_length=1, max_length=limits.MAX_COMMAND_ARGS)]
    workdir: Annotated[str, StringConstraints(max_length=limits.MAX_WORKDIR_BYTES)]
    env: Annotated[dict[Annotated[str, StringConstraints(max_length=limits.MAX_ENV_NAME_BYTES)],
                        Annotated[str, StringConstraints(max_length=limits.MAX_ENV_VALUE_BYTES)]],
                   Field(max_length=limits.MAX_ENV_VARS)]
    world_size: Annotated[int, Field(ge=1, le=limits.MAX_RANKS)]
    local_world_size: Annotated[int, Field(ge=1, le=limits.MAX_RANKS)]
    # torchrun's GROUP_RANK / GROUP_WORLD_SIZE: this node's index among the job's nodes, and their number.
    group_rank: Annotated[int, Field(ge=0, lt=limits.MAX_RANKS)] = 0
    group_world_size: Annotated[int, Field(ge=1, le=limits.MAX_RANKS)] = 1
    # False: a job submitted without ranks, which sees the environment plain ``python`` would.
    torchrun: bool = True
    # The ranks run under the owner's Unix account (the agent drops to it inside the rank).
    unix_user: UnixName | None = None
    ranks: Annotated[list[RankSlot], Field(min_length=1, max_length=limits.MAX_RANKS)]
    rendezvous: Rendezvous | None = None
    fs: bool = True  # this node keeps the job's working directory in its checkpoints (rank 0's node)
    # MASTER_ADDR as torchrun would set it: the address the node of rank 0 advertises (None: it advertised
    # none, so the ranks are on one machine: loopback).
    master_addr: Annotated[str, StringConstraints(max_length=limits.MAX_NODE_NAME_CHARS)] | None = None


class Launch(_Start):
    """Start the job's ranks on this node from scratch."""

    kind: Literal["launch"] = "launch"


class Restore(_Start):
    """Start the job's ranks on this node from a checkpoint."""

    kind: Literal["restore"] = "restore"
    checkpoint: CheckpointRef


class CutCounts(_JobOrder):
    """First step of a checkpoint over several nodes: say how many collectives each rank announced."""

    kind: Literal["cut"] = "cut"
    epoch: Count


class Park(_JobOrder):
    """Second step, in rounds: let every rank run to the ``targets`` per communicator (of ``members``) and
    wait there, or answer with the needs its ranks raised (:class:`Parked`); ``version`` grows with every
    raise. Without ``targets`` (a cut of the world group only): run to collective ``target``."""

    kind: Literal["park"] = "park"
    epoch: Count
    target: Count = 0
    targets: Targets | None = None
    members: Annotated[dict[CommKey, Members], Field(max_length=limits.MAX_COMMUNICATORS)] | None = None
    version: Count = 0

    @model_validator(mode="after")
    def _bounded(self) -> Park:
        _members_bounded((self.members or {}).values())
        return self


Then = Literal["continue", "kill", "hold"]


class Checkpoint(_JobOrder):
    """Dump every rank here and store it as ``checkpoint_id``; then go on, be killed, or stay frozen (a
    part of a checkpoint over several nodes: ``cut`` is set). ``restore_here``: ranks of the job are restored
    on this node next (a resize, a move that keeps them here): keep their images, so that the restore
    fetches nothing of them from the store. ``commit_after`` (with ``then="kill"``, every rank restored
    here next): answer once the ranks are dumped and killed (:class:`Dumped` ``committing``); the restore
    starts them from the images while the commit goes on, whose end a :class:`CommitReport` tells."""

    kind: Literal["checkpoint"] = "checkpoint"
    then: Then
    checkpoint_id: CheckpointId
    # Store checkpoints to keep when retention applies: every one the control plane still lists.
    keep_ids: Annotated[list[CheckpointId], Field(max_length=100_000)]
    rendezvous: Rendezvous | None = None
    fs: bool = True
    cut: Cut | None = None
    restore_here: bool = False
    commit_after: bool = False
    # A move after a pre-copy (the job ran on through a copy between regions): make the dump's memory ready
    # before the cut, where no last dump is there to write into; a shorter standstill, a later cut.
    warm: bool = False


class Finish(_JobOrder):
    """Last step over several nodes: kill the frozen ranks, or let them go on (rebuilding their group
    after a dump)."""

    kind: Literal["finish"] = "finish"
    then: Literal["kill", "resume"]
    rebuild: bool = False
    rendezvous: Rendezvous | None = None


class Kill(_JobOrder):
    """Stop the job's ranks here (every attempt up to ``attempt``) and say how they ended."""

    kind: Literal["kill"] = "kill"
    report: bool = False


class Prestage(_JobOrder):
    """Fetch the images of ``ranks`` from ``checkpoint`` to this node ahead of their restore here: a migration's
    target, while the job's ranks are checkpointed where they run (``attempt``). The restore that follows
    (attempt + 1) then fetches only the chunks that changed since. Not part of the job's operation: if it
    fails, or an agent of an older release refuses the order, the restore fetches everything (a new kind of
    order, not a new protocol version, for that reason)."""

    kind: Literal["prestage"] = "prestage"
    checkpoint: CheckpointRef
    ranks: Annotated[list[Rank], Field(min_length=1, max_length=limits.MAX_RANKS)]


class Unstage(_JobOrder):
    """Drop what a :class:`Prestage` of the job (up to ``attempt``) fetched here: the restore goes elsewhere or
    the migration ended without one."""

    kind: Literal["unstage"] = "unstage"


Order = Annotated[Launch | Restore | CutCounts | Park | Checkpoint | Finish | Kill | Prestage | Unstage,
                  Field(discriminator="kind")]
OrderKind = Literal["launch", "restore", "cut", "park", "checkpoint", "finish", "kill", "prestage", "unstage"]


class Action(_Versioned):
    """An order for one node's agent, with the id its result is reported under."""

    _what: ClassVar[str] = "this action"
    id: Ident
    order: Order

    @property
    def kind(self) -> OrderKind:
        return self.order.kind

    @property
    def job_id(self) -> str:
        return self.order.job_id


# -- results of the orders (in ActionResult.data) ----------------------------------------------------------
class RankPid(Message):
    rank: Rank
    pid: Annotated[int, Field(ge=1, lt=2**31)] | None


class Started(Message):
    """A launch or restore is done: each rank's process id; for a restore that replicated its checkpoint from
    another region's store first, the stored bytes that crossed and how long it took."""

    ranks: Annotated[list[RankPid], Field(max_length=limits.MAX_RANKS)]
    replicated_bytes: Count | None = None
    replicated_chunks: Count | None = None
    replicated_s: Seconds | None = None


class Counted(Message):
    """World-group collectives announced per rank (rank as a string key) at the cut; ``comms``: per
    communicator of the ranks here, the most ops one announced and its members; ``default``: the world
    group's communicator."""

    counts: Annotated[dict[Annotated[str, StringConstraints(max_length=16)], Count],
                      Field(max_length=limits.MAX_RANKS)]
    comms: Annotated[dict[CommKey, Comm], Field(max_length=limits.MAX_COMMUNICATORS)] | None = None
    default: CommKey | None = None

    @model_validator(mode="after")
    def _bounded(self) -> Counted:
        _members_bounded(c.members for c in (self.comms or {}).values())
        return self


class Parked(Message):
    """A park round here: every rank parked at its targets (no ``needs``), or the needs its ranks raised
    beyond them (the round's end for this node: the control plane raises the targets for another round)."""

    needs: Annotated[list[Need], Field(max_length=limits.MAX_COMMUNICATORS)] = []
    version: Count = 0

    @model_validator(mode="after")
    def _bounded(self) -> Parked:
        _members_bounded(n.members for n in self.needs)
        return self


class Done(Message):
    """An order with nothing to report but its success (park, finish)."""


class StoredCheckpoint(Message):
    id: CheckpointId
    created_at: Seconds
    bytes: Count
    stored_bytes: Count


class Dumped(Message):
    """``committing``: dumped, its commit to the store still under way (``stored_bytes`` is 0 until its
    :class:`CommitReport`)."""

    checkpoint: StoredCheckpoint
    committing: bool = False


class RankExit(Message):
    rank: Rank
    code: Int32 | None = None
    signal: Annotated[int, Field(ge=0, le=128)] | None = None
    # When it exited (the earliest failure is a job's root cause).
    at: Seconds | None = None
    stopped: bool = False  # stopped by Tidal after another rank failed


class Killed(Message):
    ranks: Annotated[list[RankExit], Field(max_length=limits.MAX_RANKS)]


class Prestaged(Message):
    """What a prestage fetched: the images of ``ranks`` of ``checkpoint``, ``bytes`` in all, in ``seconds``;
    and, where it first replicated the checkpoint from another region's store, what crossed (pre-copy) and how
    long that copy took."""

    checkpoint: CheckpointId
    ranks: Annotated[list[Rank], Field(max_length=limits.MAX_RANKS)]
    bytes: Count
    seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    replicated_bytes: Count | None = None
    replicated_chunks: Count | None = None
    replicated_s: Seconds | None = None


class Corruption(Message):
    """A checkpoint that failed verification: the control plane marks it bad and restores an older one."""

    checkpoint: CheckpointId | None = None
    # (Bounds on the text, not on the optional: a length constraint over ``str | None`` fails on None.)
    object: Annotated[str, StringConstraints(max_length=4096)] | None = None
    chunk: Annotated[str, StringConstraints(max_length=128)] | None = None
    reason: Annotated[str, AfterValidator(_printable), StringConstraints(max_length=4096)] | None = None
    message: Annotated[str | None, AfterValidator(_printable)] = None


class Unreachable(Message):
    """A checkpoint store that did not answer (every try failed on the way, or got a 5xx): a restore that had to
    copy its checkpoint from it (``store``, the order's ``checkpoint.source``) could not. The control plane
    restores an older checkpoint held elsewhere instead, where there is one."""

    store: Annotated[str, StringConstraints(max_length=4096), AfterValidator(_printable)]
    message: Annotated[str, StringConstraints(max_length=4000), AfterValidator(_printable)] | None = None


class Failure(Message):
    """What a failed order's result carries besides its message: the checkpoint found damaged, or the store
    that could not be reached."""

    corrupt: Corruption | None = None
    unreachable: Unreachable | None = None


Result = Started | Counted | Parked | Done | Dumped | Killed | Prestaged | Failure
RESULTS: dict[str, type[Message]] = {
    "launch": Started, "restore": Started, "cut": Counted, "park": Parked, "checkpoint": Dumped, "finish": Done,
    "kill": Killed, "prestage": Prestaged, "unstage": Done,
}


# -- agent → control plane ----------------------------------------------------------------------------------
class _FromAgent(_Versioned):
    _what: ClassVar[str] = "this {name} from an agent"
    agent_id: Ident


class GpuDevice(Message):
    """A device that is an NVIDIA GPU, as the node's agent found it through NVML: its NVML index, UUID (what
    the rank's ``CUDA_VISIBLE_DEVICES`` names), model and memory (bytes)."""

    index: Annotated[int, Field(ge=0, lt=limits.MAX_DEVICES_PER_NODE)]
    uuid: Ident
    model: Annotated[str, StringConstraints(pattern=r"^[ -~]+$", max_length=96)]
    memory_bytes: Annotated[int, Field(ge=0, lt=2**63)]


class Register(_FromAgent):
    name: NodeName
    region: Ident = "local"
    cluster: Ident = "local"
    devices: int = Field(ge=1, le=limits.MAX_DEVICES_PER_NODE)
    # device index → its CPU set. Checked as a whole by the validator below (a bad CPU id is a bad ``cpus``).
    cpus: Annotated[list[list[int]], Field(max_length=limits.MAX_DEVICES_PER_NODE)]
    # Where the other nodes reach this one (its ranks' rendezvous and collectives): `--advertise-addr`.
    advertise_addr: Address | None = None
    # device index → its GPU, on a node whose devices are NVIDIA GPUs (`--devices auto`); absent (None) on a
    # node of CPU devices, and from agents older than the field.
    gpus: Annotated[list[GpuDevice], Field(max_length=limits.MAX_DEVICES_PER_NODE)] | None = None

    @field_validator("gpus")
    @classmethod
    def _one_gpu_per_device(cls, gpus: list[GpuDevice] | None,
                            info: pydantic.ValidationInfo) -> list[GpuDevice] | None:
        devices = info.data.get("devices")
        if gpus is None:
            return None
        if devices is not None and len(gpus) != devices:
            raise InvalidField(f"{len(gpus)} GPUs for {devices} device(s): give one per device")
        if len({g.uuid for g in gpus}) != len(gpus):
            raise InvalidField("two devices name the same GPU: each device is a GPU of its own")
        return gpus

    @field_validator("cpus")
    @classmethod
    def _one_cpu_set_per_device(cls, cpus: list[list[int]], info: pydantic.ValidationInfo) -> list[list[int]]:
        devices = info.data.get("devices")
        if devices is not None and len(cpus) != devices:
            raise InvalidField(f"{len(cpus)} CPU sets for {devices} device(s): give one per device")
        for i, cs in enumerate(cpus):
            if not cs or len(set(cs)) != len(cs) or not all(0 <= c <= limits.MAX_CPU_ID for c in cs):
                raise InvalidField(f"device {i}: a CPU set is distinct CPU ids from 0 to {limits.MAX_CPU_ID}")
        return cpus


class Join(_Versioned):
    """A new node's agent asks for the node's own credential, presenting a join token (as its bearer token)."""

    _what: ClassVar[str] = "this {name} from an agent"
    name: NodeName


class Leave(_FromAgent):
    """The agent stops: its node's jobs are requeued at once."""


class Heartbeat(_FromAgent):
    # job id → {"attempt", "cpu_s", "rss_bytes", "output_bytes", "steps", "collectives", ...} for the jobs
    # running on the node
    jobs: dict[JobId, Annotated[dict[Figure, float], Field(max_length=limits.MAX_PROGRESS_FIGURES)]] = Field(
        default_factory=dict, max_length=limits.MAX_HEARTBEAT_JOBS)
    # Figures of the node itself: {"staging_memory_bytes", "staging_disk_bytes"} (its checkpoint images staged
    # in memory and on disk). Absent from older agents.
    node: dict[Figure, float] = Field(default_factory=dict, max_length=limits.MAX_PROGRESS_FIGURES)

    @field_validator("jobs")
    @classmethod
    def _finite(cls, jobs: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        # A figure that is not a finite number (a rate over no time, say) is left out, not refused: a
        # refused heartbeat would cost the node its lease. JSON cannot carry it back to users anyway.
        return {j: {k: v for k, v in figures.items() if math.isfinite(v)} for j, figures in jobs.items()}

    @field_validator("node")
    @classmethod
    def _finite_node(cls, figures: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in figures.items() if math.isfinite(v)}


class ActionResult(_FromAgent):
    action_id: Ident
    ok: bool
    error: Annotated[str | None, AfterValidator(_printable)] = None
    # The order's result (:data:`RESULTS`), or a :class:`Failure`; checked against the order's kind by
    # :func:`result_of` on the control plane, which knows the kind.
    data: dict[str, Any] = Field(default_factory=dict)


class CommitReport(_FromAgent):
    """The end of the commit of a checkpoint answered before it (:class:`Checkpoint` ``commit_after``):
    committed (``ok``: its sizes as stored) or not (``error``; the job goes on from the dump it was restored
    from, and its older committed checkpoint stays the one to fall back to)."""

    job_id: JobId
    attempt: Int32
    checkpoint_id: CheckpointId
    ok: bool
    bytes: Count = 0
    stored_bytes: Count = 0
    error: Annotated[str, StringConstraints(max_length=4000), AfterValidator(_printable)] | None = None


class ExitReport(_FromAgent):
    """Ranks of a job that ended on their own (or were killed from outside Tidal)."""

    job_id: JobId
    attempt: Int32
    ranks: Annotated[list[RankExit], Field(max_length=limits.MAX_RANKS)]


# -- encoding ------------------------------------------------------------------------------------------------
M = TypeVar("M", bound=Message)


def encode(msg: Message) -> dict[str, Any]:
    """The message as JSON-ready data (what crosses the network and what the database keeps)."""
    return msg.model_dump(mode="json")


def check_version(data: Any, what: str) -> None:
    """Refuse a message of a protocol version this build does not speak, before reading anything else."""
    v = data.get("v", VERSION) if isinstance(data, dict) else VERSION
    if isinstance(v, bool) or not isinstance(v, int) or v not in ACCEPTED:
        raise ProtocolMismatch(
            f"{what} speaks protocol version {v!r}; this Tidal speaks version"
            f"{'s' if len(ACCEPTED) > 1 else ''} {', '.join(map(str, sorted(ACCEPTED)))}", version=v,
            accepted=sorted(ACCEPTED),
            hint="run the same Tidal release on the control plane and its agents: upgrade the older one")


def decode(model: type[M], data: Any, what: str | None = None) -> M:
    """``data`` as a ``model``, or a ValidationError naming the first bad field (a ProtocolMismatch, first,
    for a versioned message of another version)."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise _invalid(exc, what or model.__name__) from None


def _invalid(exc: pydantic.ValidationError, what: str) -> ValidationError:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("kind")  # an order of no kind this build knows
    where = ".".join(loc) or "(message)"
    return ValidationError(f"bad {what}: {where}: {err['msg']}", field=where,
                           hint="the control plane and the agent must run the same Tidal release")


def decode_action(data: Any) -> Action:
    """An action as the agent receives it; another protocol version is a ProtocolMismatch."""
    return decode(Action, data, "action")


_ORDER: TypeAdapter[Order] = TypeAdapter(Order)


def decode_order(data: Any) -> Order:
    """An order on its own (as the control plane stores it, ``kind`` included)."""
    try:
        return _ORDER.validate_python(data)
    except pydantic.ValidationError as exc:
        raise _invalid(exc, "order") from None


def result_of(kind: str, ok: bool, data: Any) -> Result:
    """An action's result data as the typed result of an order of ``kind`` (a :class:`Failure` when not ok)."""
    model = RESULTS.get(kind) if ok else Failure
    if model is None:
        raise ValidationError(f"no order of kind {kind!r}", field="kind", hint=f"one of {sorted(RESULTS)}")
    out = decode(model, data, f"result of a {kind} order")
    assert isinstance(out, Started | Counted | Parked | Done | Dumped | Killed | Prestaged | Failure)
    return out
