"""Job traces: loaders, the tier assignment rule, and load rescaling.

Formats (times in seconds):
- ``philly``: the Pollux processing of the Microsoft Philly log, ``timestamp,duration,num_gpus,gpu_time,
  cluster`` (``.csv`` or ``.csv.xz``); ``cluster`` (the virtual cluster) becomes the job's project.
- ``gavel``: Gavel's per-VC Philly traces (``<vc>.trace``, tab-separated, or a ``.tar.xz`` of them):
  ``job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor``. They
  give steps, not seconds; without Gavel's throughput oracle a step counts ``gavel_step_s`` seconds.
- ``generic``: ``submit_time,duration,num_gpus[,tier,project,user]`` with a header row.
Tiers missing from a trace come from :func:`assign_tiers` (seeded, documented below). A trace without users
(Philly's Pollux processing and Gavel's drop the log's user field) runs as one user's: the policy's turns
between users then change nothing. :func:`assign_users` draws synthetic users for such a trace (seeded) where
a run is to weigh fairness between users.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import lzma
import math
import os
import random
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Literal

from tidal.core import Tier
from tidal.errors import ValidationError
from tidal.sim.cost import family_size_gb

OnBadRow = Literal["skip", "fail"]


@dataclasses.dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float
    duration: float  # run time at full size on dedicated devices (T_ideal)
    gpus: int
    tier: Tier | None = None
    project: str = "default"
    mem_gb: float | None = None  # a rank's checkpoint image where the trace tells (its model), GB
    user: str | None = None  # who submitted it, where the trace tells (None: every such job one user's)


@dataclasses.dataclass
class BadRow:
    line: int
    reason: str


@dataclasses.dataclass
class Trace:
    jobs: list[TraceJob]
    bad_rows: list[BadRow] = dataclasses.field(default_factory=list)
    source: str = ""
    origin: float = 0.0  # absolute time (epoch seconds for Philly) of submit time 0

    @property
    def window(self) -> tuple[float, float]:
        if not self.jobs:
            return (0.0, 0.0)
        return (self.jobs[0].submit, self.jobs[-1].submit)


def _open_text(path: str) -> io.TextIOBase:
    if path.endswith(".xz"):
        return io.TextIOWrapper(lzma.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


_ROW_HINT = "fix the row or pass --on-bad-row skip"


def _bad(bad: list[BadRow], line: int, reason: str, on_bad_row: OnBadRow) -> None:
    if on_bad_row == "fail":
        raise ValidationError(f"bad trace row at line {line}: {reason}", field="trace", line=line, hint=_ROW_HINT)
    bad.append(BadRow(line, reason))


def _wrong(reason: str) -> ValidationError:
    """What is wrong with one field of a row (the loaders turn it into a bad row)."""
    return ValidationError(reason, field="trace", hint=_ROW_HINT)


def _reason(exc: ValueError | ValidationError) -> str:
    """Why a row is bad: a field's :func:`_wrong`, or a ``ValueError`` of a parser (a date, say)."""
    return exc.message if isinstance(exc, ValidationError) else str(exc)


def _num(value: str | None, name: str, *, positive: bool = False) -> float:
    if value is None or value.strip() == "":
        raise _wrong(f"missing {name}")
    try:
        x = float(value)
    except ValueError:
        raise _wrong(f"{name} is not a number: {value!r}") from None
    if not math.isfinite(x):
        raise _wrong(f"{name} is not finite")
    if x < 0:
        raise _wrong(f"negative {name}: {value}")
    if positive and x <= 0:
        raise _wrong(f"{name} must be > 0: {value}")
    return x


def _gpus(value: str | None) -> int:
    g = _num(value, "num_gpus", positive=True)
    if g != int(g):
        raise _wrong(f"num_gpus is not an integer: {value}")
    return int(g)


def _csv_rows(path: str, need: set[str], header_error: str) -> Iterator[tuple[int, dict[str, str]]]:
    """The rows of a CSV trace and their line numbers, once its header is known to have the columns
    ``need`` (else ``header_error``)."""
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        if not need <= set(reader.fieldnames or ()):
            raise ValidationError(f"{path}: {header_error}", field="trace",
                                  hint="pass --format to name the trace's format, or give the file that header")
        for row in reader:
            yield reader.line_num, row


def _jobs_of_rows(path: str, rows: Iterable[tuple[int, dict[str, str]]],
                  job: Callable[[int, dict[str, str]], TraceJob], on_bad_row: OnBadRow) -> Trace:
    """The trace of ``path``: ``job(line, row)`` for each of its rows, a bad row where that fails."""
    jobs: list[TraceJob] = []
    bad: list[BadRow] = []
    for line, row in rows:
        try:
            jobs.append(job(line, row))
        except (ValueError, ValidationError) as exc:
            _bad(bad, line, _reason(exc), on_bad_row)
    return _finish(jobs, bad, path)


def load_philly(path: str, *, on_bad_row: OnBadRow = "skip") -> Trace:
    need = {"timestamp", "duration", "num_gpus"}
    rows = _csv_rows(path, need, f"not a Philly CSV (need columns {sorted(need)})")
    return _jobs_of_rows(path, rows, _philly_job, on_bad_row)


def _philly_job(line: int, row: dict[str, str]) -> TraceJob:
    ts = row.get("timestamp")
    if not ts:
        raise _wrong("missing timestamp")
    submit = datetime.strptime(ts.strip(), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    dur = _num(row.get("duration"), "duration")
    gpus = _gpus(row.get("num_gpus"))
    project = (row.get("cluster") or "").strip() or "unknown"
    return TraceJob(f"j{line - 1}", submit, dur, gpus, None, project)


def load_generic(path: str, *, on_bad_row: OnBadRow = "skip") -> Trace:
    rows = _csv_rows(path, {"submit_time", "duration", "num_gpus"},
                     "a generic trace needs the columns submit_time,duration,num_gpus[,tier,project,user]")
    return _jobs_of_rows(path, rows, _generic_job, on_bad_row)


def _generic_job(line: int, row: dict[str, str]) -> TraceJob:
    submit = _num(row.get("submit_time"), "submit_time")
    dur = _num(row.get("duration"), "duration")
    gpus = _gpus(row.get("num_gpus"))
    tier_s = (row.get("tier") or "").strip()
    tier = Tier.parse(tier_s) if tier_s else None
    project = (row.get("project") or "").strip() or "default"
    user = (row.get("user") or "").strip() or None
    return TraceJob(f"j{line - 1}", submit, dur, gpus, tier, project, user=user)


def _gavel_rows(path: str) -> Iterator[tuple[str, str, bytes]]:
    if path.endswith((".tar.xz", ".tar")):
        with tarfile.open(path) as tar:
            members = sorted((m for m in tar.getmembers() if m.name.endswith(".trace")), key=lambda m: m.name)
            for m in members:
                f = tar.extractfile(m)
                if f is not None:
                    yield m.name, os.path.basename(m.name)[: -len(".trace")], f.read()
    else:
        with open(path, "rb") as fb:
            yield path, os.path.basename(path).removesuffix(".trace"), fb.read()


def load_gavel(path: str, *, on_bad_row: OnBadRow = "skip", gavel_step_s: float = 1.0,
               seed_dir: str = "seed=0") -> Trace:
    """Gavel VC traces; from a tarball, only the ``seed_dir`` sample (seed=0 by default)."""
    jobs: list[TraceJob] = []
    bad: list[BadRow] = []
    for name, vc, data in _gavel_rows(path):
        if path.endswith((".tar.xz", ".tar")) and f"/{seed_dir}/" not in f"/{name}":
            continue
        for i, raw in enumerate(data.decode("utf-8").splitlines(), start=1):
            if not raw.strip():
                continue
            cols = raw.split("\t")
            try:
                if len(cols) != 7:
                    raise _wrong(f"expected 7 tab-separated fields, got {len(cols)}")
                steps = _num(cols[4], "total_steps", positive=True)
                arrival = _num(cols[5], "arrival_time_s")
                gpus = _gpus(cols[6])
            except (ValueError, ValidationError) as exc:
                _bad(bad, i, f"{name}: {_reason(exc)}", on_bad_row)
                continue
            jobs.append(TraceJob(f"{vc}-{i}", arrival, steps * gavel_step_s, gpus, None, vc,
                                 family_size_gb(cols[0])))
    return _finish(jobs, bad, path)


def _finish(jobs: list[TraceJob], bad: list[BadRow], path: str) -> Trace:
    jobs.sort(key=lambda j: (j.submit, j.id))
    t0 = jobs[0].submit if jobs else 0.0
    if jobs:
        jobs = [dataclasses.replace(j, submit=j.submit - t0) for j in jobs]
    return Trace(jobs, bad, path, t0)


def load_trace(path: str, *, fmt: str = "auto", on_bad_row: OnBadRow = "skip", gavel_step_s: float = 1.0) -> Trace:
    if not os.path.exists(path):
        raise ValidationError(f"trace not found: {path}", field="trace", hint="check the path given to --trace")
    if fmt == "auto":
        base = os.path.basename(path)
        if base.endswith((".trace", ".tar.xz")):
            fmt = "gavel"
        else:
            with _open_text(path) as f:
                header = f.readline()
            fmt = "philly" if header.startswith("timestamp,") else "generic"
    if fmt == "philly":
        return load_philly(path, on_bad_row=on_bad_row)
    if fmt == "gavel":
        return load_gavel(path, on_bad_row=on_bad_row, gavel_step_s=gavel_step_s)
    if fmt == "generic":
        return load_generic(path, on_bad_row=on_bad_row)
    raise ValidationError(f"unknown trace format {fmt!r}", field="format",
                          hint="pass --format philly, gavel, generic or auto")


DEFAULT_MIX = (0.2, 0.3, 0.5)  # premium, standard, basic


def assign_tiers(jobs: Sequence[TraceJob], *, seed: int = 0, mix: tuple[float, float, float] = DEFAULT_MIX
                 ) -> list[TraceJob]:
    """Give a tier to each job without one: an independent draw per job, in trace order, from
    ``random.Random(seed)``: premium with probability mix[0], standard mix[1], else basic."""
    if abs(sum(mix) - 1.0) > 1e-9 or min(mix) < 0:
        raise ValidationError("tier mix must be three non-negative shares summing to 1", field="tier_mix",
                              hint="pass --tier-mix premium,standard,basic, e.g. 0.2,0.3,0.5")
    rng = random.Random(seed)
    out = []
    for j in jobs:
        u = rng.random()
        if j.tier is not None:
            out.append(j)
            continue
        tier = Tier.PREMIUM if u < mix[0] else Tier.STANDARD if u < mix[0] + mix[1] else Tier.BASIC
        out.append(dataclasses.replace(j, tier=tier))
    return out


def assign_users(jobs: Sequence[TraceJob], *, users_per_project: int = 8, zipf_s: float = 1.0,
                 burst_s: float = 60.0, seed: int = 0) -> list[TraceJob]:
    """Give a synthetic user to each job without one. Jobs of a project submitted within ``burst_s`` of the
    project's previous job form a burst (a sweep, one user's submissions); each burst's user is drawn from
    the project's ``users_per_project`` users ``<project>/u<k>`` with Zipf weights 1/k^``zipf_s`` (a few
    users submit most bursts, as on shared clusters), from ``random.Random(seed)``, in trace order."""
    if users_per_project < 1:
        raise ValidationError("users_per_project must be 1 or more", field="users_per_project",
                              hint="give the number of users each project's jobs are drawn among, e.g. 8")
    rng = random.Random(seed)
    weights = [1.0 / (k ** zipf_s) for k in range(1, users_per_project + 1)]
    last: dict[str, tuple[float, str]] = {}  # project → (its last submission, that burst's user)
    out = []
    for j in jobs:
        if j.user is not None:
            out.append(j)
            continue
        prev = last.get(j.project)
        if prev is not None and j.submit - prev[0] <= burst_s:
            user = prev[1]
        else:
            k = rng.choices(range(1, users_per_project + 1), weights)[0]
            user = f"{j.project}/u{k}"
        last[j.project] = (j.submit, user)
        out.append(dataclasses.replace(j, user=user))
    return out


def offered_load(jobs: Iterable[TraceJob], capacity: int) -> float:
    js = list(jobs)
    if len(js) < 2:
        return 0.0
    window = js[-1].submit - js[0].submit
    work = sum(j.duration * j.gpus for j in js)
    return work / (capacity * window) if window > 0 else float("inf")


def rescale_load(jobs: Sequence[TraceJob], capacity: int, load: float) -> list[TraceJob]:
    """Scale submission times so that GPU-time demanded ÷ (capacity × submission window) = ``load``."""
    if load <= 0:
        raise ValidationError("--load must be > 0", field="load", hint="pass a --load above 0, e.g. 0.9")
    current = offered_load(jobs, capacity)
    if current == 0 or not math.isfinite(current):
        return list(jobs)
    f = current / load
    t0 = jobs[0].submit
    return [dataclasses.replace(j, submit=t0 + (j.submit - t0) * f) for j in jobs]
