"""Regions with a checkpoint store each: a job migrated to another region has its checkpoint copied to that
region's store first (only the chunks it lacks), resumes there and finishes byte-identical to an
uninterrupted run; moved back, only what changed crosses again. A job whose newest checkpoint is in a store
that went down resumes elsewhere from an older one held there."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.system.cluster import JOB, reference_run
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing import wait_until
from tidal.testing.seaweedfs import SeaweedFS

pytestmark = pytest.mark.criu

_CROSSED = re.compile(r"checkpoint (\S+) copied from region (\S+) to (\S+): (\d+) chunk\(s\), ([\d.]+ \S+) crossed")


def crossed(job: dict) -> list[tuple[str, str, str]]:
    return [m.groups()[:3] for e in job["events"] if e["kind"] == "replicated"
            and (m := _CROSSED.search(e["detail"]))]


@pytest.mark.slow
def test_a_job_moves_between_regions_and_back(make_cluster, workdir: Path, gate: Path, tmp_path: Path) -> None:
    west, east = tmp_path / "store-west", tmp_path / "store-east"
    c = make_cluster(nodes=2, devices=1, regions=("west", "east"), stores=(f"west={west}", f"east={east}"))
    expected_out, expected_progress = reference_run(tmp_path)
    nodes = {n["name"]: n for n in c.api().get("/v1/nodes").json()}
    assert {n: v["region"] for n, v in nodes.items()} == {"node-1": "west", "node-2": "east"}
    region_of = {"node-1": "west", "node-2": "east"}
    other = {"west": "east", "east": "west"}

    job = c.cli("submit", "--env", "GATE", "--quiet", "--", "sh", "-c", JOB, cwd=workdir,
                env={"GATE": str(gate)}).stdout.strip()
    j = c.wait_state(job, "running")
    first = region_of[j["placement"][0]["node"]]
    progress = workdir / "progress.txt"
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 10, timeout=30, what="progress")

    # To the other region: its checkpoint is taken into this region's store, then copied to the other's.
    c.cli("migrate", job, "--to-region", other[first])
    j = c.show(job)
    assert j["state"] == "running" and region_of[j["placement"][0]["node"]] == other[first]
    ck1 = j["checkpoints"][-1]
    assert ck1["regions"] == sorted([first, other[first]])
    assert crossed(j) == [(ck1["id"], first, other[first])]
    stores = {"west": CheckpointStore(west), "east": CheckpointStore(east)}
    part = ck1["parts"][0]
    for store in stores.values():  # the same checkpoint, byte for byte, in both regions' stores
        store.verify(job, part)
    names = stores[first].reader(job, part).names()
    assert stores[other[first]].reader(job, part).names() == names

    # And back: the new checkpoint crosses the other way, only the chunks the first region lacks.
    wait_until(lambda: len(progress.read_text().split()) >= 40, timeout=30, what="progress after the move")
    c.cli("migrate", job, "--to-region", first)
    j = c.show(job)
    assert j["state"] == "running" and region_of[j["placement"][0]["node"]] == first
    ck2 = j["checkpoints"][-1]
    assert crossed(j)[-1] == (ck2["id"], other[first], first)
    # Exactly the chunks of the new checkpoint that the first region's store did not hold crossed.
    taken_first = _chunks(stores[first], job, ck1["parts"][0])  # taken in the first region
    taken_second = _chunks(stores[other[first]], job, ck2["parts"][0])  # taken in the other
    copied = [int(m.group(4)) for e in j["events"] if e["kind"] == "replicated"
              and (m := _CROSSED.search(e["detail"]))]
    assert copied == [len(taken_first), len(taken_second - taken_first)]
    assert copied[1] < copied[0]

    gate.touch()
    done = c.cli("wait", job, check=False)
    assert done.returncode == 0, done.stderr
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert progress.read_bytes() == expected_progress


@pytest.mark.slow
def test_the_last_checkpoint_is_copied_ahead_of_a_move(make_cluster, workdir: Path, gate: Path,
                                                       tmp_path: Path) -> None:
    """Pre-copy: while the job is checkpointed for the move, the target region's node copies the job's last
    checkpoint into its store; the move itself then copies only the chunks the migration's checkpoint has
    that the last one had not."""
    west, east = tmp_path / "store-west", tmp_path / "store-east"
    c = make_cluster(nodes=2, devices=1, regions=("west", "east"), stores=(f"west={west}", f"east={east}"))
    expected_out, expected_progress = reference_run(tmp_path)
    region_of = {"node-1": "west", "node-2": "east"}
    other = {"west": "east", "east": "west"}
    job = c.cli("submit", "--env", "GATE", "--quiet", "--checkpoint-every", "3s", "--", "sh", "-c", JOB,
                cwd=workdir, env={"GATE": str(gate)}).stdout.strip()
    first = region_of[c.wait_state(job, "running")["placement"][0]["node"]]
    wait_until(lambda: c.show(job)["checkpoints"], timeout=60, what="a periodic checkpoint")

    c.cli("migrate", job, "--to-region", other[first])
    j = c.show(job)
    assert j["state"] == "running" and region_of[j["placement"][0]["node"]] == other[first]
    copies = [(m.group(1), int(m.group(4)), "ahead of the move" in e["detail"]) for e in j["events"]
              if e["kind"] == "replicated" and (m := _CROSSED.search(e["detail"]))]
    (ahead, ahead_chunks, _), (moved, moved_chunks, _) = sorted(copies, key=lambda x: not x[2])
    assert [x[2] for x in sorted(copies, key=lambda x: not x[2])] == [True, False], copies
    stores = {"west": CheckpointStore(west), "east": CheckpointStore(east)}
    last = _chunks(stores[first], job, ahead)
    taken = _chunks(stores[first], job, moved)
    assert ahead_chunks == len(last)
    assert moved_chunks == len(taken - last) < len(taken)

    gate.touch()
    done = c.cli("wait", job, check=False)
    assert done.returncode == 0, done.stderr
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress


@pytest.mark.slow
def test_basic_work_moves_to_the_idle_region_when_premium_work_needs_its_node(
        make_cluster, workdir: Path, gate: Path, tmp_path: Path) -> None:
    """The scheduler's own move (policy/spill.py): a premium job pinned to the region whose only node a basic
    job fills takes that node, and the basic job, rather than being preempted, moves to the other region's idle
    node, its checkpoint copied there, and finishes byte-identical to an uninterrupted run."""
    west, east = tmp_path / "store-west", tmp_path / "store-east"
    c = make_cluster(nodes=2, devices=1, regions=("west", "east"), stores=(f"west={west}", f"east={east}"))
    expected_out, expected_progress = reference_run(tmp_path)
    region_of = {"node-1": "west", "node-2": "east"}
    other = {"west": "east", "east": "west"}
    basic = c.cli("submit", "--env", "GATE", "--quiet", "--", "sh", "-c", JOB, cwd=workdir,
                  env={"GATE": str(gate)}).stdout.strip()
    first = region_of[c.wait_state(basic, "running")["placement"][0]["node"]]
    progress = workdir / "progress.txt"
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 10, timeout=30, what="progress")

    elsewhere = tmp_path / "premium"
    elsewhere.mkdir()
    premium = c.cli("submit", "--tier", "premium", "--region", first, "--env", "GATE", "--quiet", "--", "sh", "-c",
                    'while [ ! -e "$GATE" ]; do sleep 0.05; done', cwd=elsewhere,
                    env={"GATE": str(gate)}).stdout.strip()
    p = c.wait_state(premium, "running", timeout=60)
    assert region_of[p["placement"][0]["node"]] == first

    def moved() -> dict | None:
        j = c.job(basic)
        return j if j["state"] == "running" and not j["busy"] and all(x["pid"] for x in j["placement"]) and {
            region_of[x["node"]] for x in j["placement"]} == {other[first]} else None

    wait_until(moved, timeout=60, what="the basic job running in the other region")
    j = c.show(basic)
    why = [e["detail"] for e in j["events"] if e["kind"] == "migrate"]
    assert len(why) == 1 and f"make room for {premium}" in why[0], j["events"]
    assert not any(e["kind"] == "preempted" for e in j["events"]), j["events"]
    assert crossed(j) == [(j["checkpoints"][-1]["id"], first, other[first])]

    gate.touch()
    for job in (basic, premium):
        done = c.cli("wait", job, check=False)
        assert done.returncode == 0, done.stderr
    assert c.cli("logs", basic).stdout.encode() == expected_out
    assert progress.read_bytes() == expected_progress


def test_migrating_to_an_unknown_region_says_which_there_are(make_cluster, workdir: Path, gate: Path) -> None:
    c = make_cluster(nodes=2, devices=1, regions=("west", "east"))
    job = c.cli("submit", "--env", "GATE", "--quiet", "--", "sh", "-c", JOB, cwd=workdir,
                env={"GATE": str(gate)}).stdout.strip()
    c.wait_state(job, "running")
    bad = c.cli("migrate", job, "--to-region", "north", check=False)
    assert bad.returncode != 0
    assert "no region north" in bad.stderr and "the regions are: east, west" in bad.stderr
    both = c.cli("migrate", job, "--to-region", "east", "--to", "node-2", check=False)
    assert "give a node (--to, --rank) or a region or cluster to move to, not both" in both.stderr
    assert c.job(job)["state"] == "running"
    c.cli("cancel", job)


@pytest.mark.slow
@pytest.mark.s3
def test_a_checkpoint_in_a_store_that_went_down_is_skipped_for_an_older_one(
        make_cluster, workdir: Path, gate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """West's store is an S3 server of its own, east's a directory. The job's newest checkpoint is in west's
    store only, an older one in both; west's store and node go down: the job, resumed in east, cannot have its
    newest checkpoint copied, so it resumes from the older one, without a restart counted, and finishes
    byte-identical to an uninterrupted run."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'tidal[s3]')")
    weed = SeaweedFS()
    try:
        for key, value in weed.store_env().items():  # the agents' settings for an S3 store
            monkeypatch.setenv(key, value)
        west_store = weed.url("west")
        c = make_cluster(nodes=2, devices=1, regions=("west", "east"),
                         stores=(f"west={west_store}", f"east={tmp_path / 'store-east'}"))
        expected_out, expected_progress = reference_run(tmp_path)
        region_of = {"node-1": "west", "node-2": "east"}
        job = c.cli("submit", "--env", "GATE", "--quiet", "--", "sh", "-c", JOB, cwd=workdir,
                    env={"GATE": str(gate)}).stdout.strip()
        first = region_of[c.wait_state(job, "running")["placement"][0]["node"]]
        if first == "west":  # a checkpoint taken in east's store first
            c.cli("migrate", job, "--to-region", "east")
        c.cli("migrate", job, "--to-region", "west")  # the one taken in east is in both stores now
        c.cli("preempt", job)  # the newest, taken in west, is in west's store alone
        j = c.wait_state(job, "preempted")
        older, newest = j["checkpoints"][-2:]
        assert (older["regions"], newest["regions"]) == (["east", "west"], ["west"])

        weed.shutdown(kill=True)
        os.kill(c.state.agents["node-1"].pid, signal.SIGKILL)
        wait_until(lambda: not {n["name"]: n["up"] for n in c.api().get("/v1/nodes").json()}["node-1"],
                   timeout=30, what="node-1 down")
        c.cli("resume", job, "--no-wait")
        j = c.wait_state(job, "running", timeout=60)
        assert j["placement"][0]["node"] == "node-2" and j["restarts"] == 0
        j = c.show(job)
        (skipped,) = [e["detail"] for e in j["events"] if e["kind"] == "checkpoint_skipped"]
        assert skipped.startswith(f"checkpoint {newest['id']} is skipped: node-2 could not copy it from region "
                                  f"west's store: the checkpoint store {west_store} cannot be reached: "), skipped
        assert skipped.endswith(f"; resuming from checkpoint {older['id']}, the newest older one, held in region "
                                "east's store"), skipped
        running = [e["detail"] for e in j["events"] if e["kind"] == "running"]
        assert running[-1] == f"on node-2 devices [0], restoring from checkpoint {older['id']}"

        gate.touch()
        done = c.cli("wait", job, check=False)
        assert done.returncode == 0, done.stderr
        assert c.cli("logs", job).stdout.encode() == expected_out
        assert (workdir / "progress.txt").read_bytes() == expected_progress
    finally:
        weed.stop()


def _chunks(store: CheckpointStore, job: str, part: str) -> set[str]:
    reader = store.reader(job, part)
    return {h for name in reader.names() for h, _ in reader.entry(name).chunks}
