"""The working directory is put back exactly as it was at the checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.errors import CheckpointError
from tidal.mechanisms.criu.fsstate import FsSnapshot, FsTracker, scan


def _tree(root: Path) -> dict[str, bytes | str | None]:
    out: dict[str, bytes | str | None] = {}
    for path, entry in scan(root).items():
        p = root / path
        out[path] = (os.readlink(p) if entry.kind == "l" else p.read_bytes() if entry.kind == "f" else None)
    return out


def _roundtrip(snap: FsSnapshot) -> FsSnapshot:
    return FsSnapshot.from_json(snap.to_json())


def _fetch_from(staging: Path):  # type: ignore[no-untyped-def]
    def fetch(paths: list[str], into: Path) -> None:
        for p in paths:
            (into / p).parent.mkdir(parents=True, exist_ok=True)
            (into / p).write_bytes((staging / p).read_bytes())
    return fetch


def test_restore_rolls_back_creations_modifications_and_deletions(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "input.bin").write_bytes(b"x" * 1000)
    (work / "notes.txt").write_text("inputs\n")
    tracker = FsTracker.at_launch(work)

    # The job runs: creates, modifies its own files, and deletes an input.
    (work / "out").mkdir()
    (work / "out" / "log.csv").write_text("1\n2\n")
    (work / "ckpt.pt").write_bytes(b"weights-v1")
    (work / "latest").symlink_to("ckpt.pt")
    (work / "notes.txt").unlink()
    staging = tmp_path / "staging"
    snap = _roundtrip(tracker.capture(staging))
    at_checkpoint = _tree(work)
    assert sorted(snap.captured) == ["ckpt.pt", "out/log.csv"]  # inputs are never copied

    # It goes on after the checkpoint.
    (work / "out" / "log.csv").write_text("1\n2\n3\n4\n")
    (work / "ckpt.pt").write_bytes(b"weights-v2-longer")
    (work / "late").mkdir()
    (work / "late" / "x").write_text("after")
    (work / "after.txt").write_text("after")
    (work / "latest").unlink()
    (work / "latest").symlink_to("after.txt")
    os.chmod(work / "out" / "log.csv", 0o640)

    tracker.restore(snap, _fetch_from(staging), tmp_path / "scratch")
    assert _tree(work) == at_checkpoint
    assert scan(work) == snap.entries  # same modes and mtimes, too


def test_restore_refuses_when_an_input_changed_and_changes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "input.txt").write_text("v1")
    tracker = FsTracker.at_launch(work)
    (work / "made.txt").write_text("made")
    snap = tracker.capture(tmp_path / "staging")
    (work / "input.txt").write_text("v2, changed in place")
    (work / "new.txt").write_text("new")
    before = _tree(work)
    with pytest.raises(CheckpointError, match="input file .*input.txt changed"):
        tracker.restore(snap, _fetch_from(tmp_path / "staging"), tmp_path / "scratch")
    assert _tree(work) == before


def test_restore_into_missing_workdir_says_so(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tracker = FsTracker.at_launch(work)
    snap = tracker.capture(tmp_path / "staging")
    work.rmdir()
    with pytest.raises(CheckpointError, match="working directory .* does not exist"):
        tracker.restore(snap, _fetch_from(tmp_path / "staging"), tmp_path / "scratch")


def test_baseline_roundtrips_through_json(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    tracker = FsTracker.at_launch(tmp_path)
    again = FsTracker.from_json(tmp_path, tracker.baseline_json())
    assert again.baseline == tracker.baseline


def test_ignored_paths_are_neither_saved_nor_put_back(tmp_path: Path) -> None:
    # A batch system's output file of the job, and a store inside the working directory, are not its state:
    # they grow on their own, and a restore must neither roll them back nor remove them.
    work = tmp_path / "work"
    work.mkdir()
    (work / "slurm.out").write_text("line 1\n")
    ignore = frozenset({"slurm.out", "store"})
    tracker = FsTracker.at_launch(work, ignore=ignore)
    (work / "slurm.out").write_text("line 1\nline 2\n")
    (work / "store" / "chunks").mkdir(parents=True)
    (work / "store" / "chunks" / "a").write_text("chunk a")
    (work / "state.txt").write_text("step 1")
    staging = tmp_path / "staging"
    snap = _roundtrip(tracker.capture(staging))
    assert snap.captured == ["state.txt"] and sorted(snap.entries) == ["state.txt"]

    (work / "slurm.out").write_text("line 1\nline 2\nline 3\n")
    (work / "store" / "chunks" / "b").write_text("chunk b")
    (work / "state.txt").write_text("step 2")
    restored = FsTracker.from_json(work, tracker.baseline_json(), ignore=ignore)
    restored.restore(snap, _fetch_from(staging), tmp_path / "scratch")
    assert _tree(work) == {"slurm.out": b"line 1\nline 2\nline 3\n", "state.txt": b"step 1", "store": None,
                           "store/chunks": None, "store/chunks/a": b"chunk a", "store/chunks/b": b"chunk b"}


def test_restored_directories_keep_their_mtimes_so_a_job_can_order_them_by_time(tmp_path: Path) -> None:
    # Hugging Face's Trainer keeps its newest checkpoints, newest by their directories' mtimes: putting the
    # files back must not make an older checkpoint directory look newer.
    work = tmp_path / "work"
    work.mkdir()
    tracker = FsTracker.at_launch(work)
    for n, t in ((4, 1_000_000_000), (8, 2_000_000_000)):
        (work / f"checkpoint-{n}").mkdir()
        (work / f"checkpoint-{n}" / "model.bin").write_bytes(b"w" * n)
        os.utime(work / f"checkpoint-{n}", ns=(t, t))
    staging = tmp_path / "staging"
    snap = _roundtrip(tracker.capture(staging))
    tracker.restore(snap, _fetch_from(staging), tmp_path / "scratch")
    assert [os.stat(work / f"checkpoint-{n}").st_mtime_ns for n in (4, 8)] == [1_000_000_000, 2_000_000_000]
    assert scan(work) == snap.entries
