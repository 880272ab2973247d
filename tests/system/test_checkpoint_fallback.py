"""Damaged checkpoints on a real cluster: a chunk of the newest checkpoint is damaged in the store; resuming
marks it bad and resumes from the one before, with output identical to an uninterrupted run. And
`tidal resume --from` picks a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.system.cluster import JOB, LiveCluster, reference_run
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.chunks import chunk_key
from tidal.testing import wait_until

pytestmark = pytest.mark.criu


def _progress(workdir: Path) -> int:
    p = workdir / "progress.txt"
    return len(p.read_text().split()) if p.exists() else 0


def _stop(c: LiveCluster, job: str) -> str:
    """Preempt through the API (quicker than the CLI: the job stays well before its gate at step 80) and
    return the checkpoint taken."""
    with c.api() as api:
        assert api.post(f"/v1/jobs/{job}/preempt").status_code == 200
    j = c.wait_state(job, "preempted")
    return str(j["checkpoints"][-1]["id"])


def two_checkpoints(c: LiveCluster, workdir: Path, gate: Path) -> tuple[str, str, str]:
    """A job stopped (held) after two checkpoints that differ in its progress file."""
    job = c.cli("submit", "-q", "--env", f"GATE={gate}", "--", "sh", "-c", JOB, cwd=workdir).stdout.strip()
    c.wait_state(job, "running")
    wait_until(lambda: _progress(workdir) >= 3, timeout=30, what="progress")
    first = _stop(c, job)
    seen = _progress(workdir)
    with c.api() as api:
        assert api.post(f"/v1/jobs/{job}/resume").status_code == 200
    c.wait_state(job, "running")
    wait_until(lambda: _progress(workdir) >= seen + 3, timeout=30, what="progress after the first checkpoint")
    second = _stop(c, job)
    return job, first, second


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(make_cluster, workdir: Path, gate: Path,
                                                                 tmp_path: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    expected_out, expected_progress = reference_run(tmp_path)
    job, first, second = two_checkpoints(c, workdir, gate)

    # Damage a chunk of the file-system state that only the newest checkpoint holds.
    store = CheckpointStore(c.settings.store_url)
    try:
        old = {h for h, _ in store.reader(job, first).entry("fs/progress.txt").chunks}
        new = [h for h, _ in store.reader(job, second).entry("fs/progress.txt").chunks if h not in old]
    finally:
        store.close()
    assert new, "the two checkpoints hold the same progress file: nothing of its own to damage"
    chunk = Path(c.settings.store_url) / chunk_key(new[0])
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))

    out = c.cli("resume", job).stdout
    j = c.show(job)
    assert j["state"] == "running" and j["restarts"] == 0
    (bad,) = [e for e in j["events"] if e["kind"] == "checkpoint_bad"]
    assert bad["detail"].startswith(f"checkpoint {second} is damaged: checkpoint {job}/{second}: file "
                                    f"'fs/progress.txt': chunk {new[0]} is ")
    assert bad["detail"].endswith(f"(found on node-1); it is kept for inspection and not restored again; "
                                  f"resuming from checkpoint {first}")
    assert " ".join(bad["detail"].split()) in " ".join(out.split())  # `tidal resume` said so
    after = [e for e in j["events"] if e["seq"] > bad["seq"]]
    assert [e["kind"] for e in after] == ["running", "pending", "running", "started"]
    assert after[2]["detail"] == f"on node-1 devices [0], restoring from checkpoint {first}"

    listed = json.loads(c.cli("checkpoints", job, "-o", "json").stdout)
    assert [(x["id"], x["state"]) for x in listed] == [(first, "committed"), (second, "bad")]
    table = c.cli("checkpoints", job).stdout
    assert second in table and "bad" in table
    # Kept for inspection: still in the store.
    assert (Path(c.settings.store_url) / "jobs" / job / second / "manifest.json").exists()

    # A bad checkpoint cannot be chosen.
    with c.api() as api:
        r = api.post(f"/v1/jobs/{job}/resume", json={"from": second})
    assert r.status_code == 409 and r.json()["field"] == "from" and r.json()["checkpoint"] == second
    refused = c.cli("resume", job, "--from", second, check=False)
    assert refused.returncode != 0 and "is bad" in refused.stderr + refused.stdout

    gate.touch()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress


def test_resume_from_a_chosen_checkpoint(make_cluster, workdir: Path, gate: Path, tmp_path: Path) -> None:
    c = make_cluster(nodes=1, devices=1)
    expected_out, expected_progress = reference_run(tmp_path)
    job, first, second = two_checkpoints(c, workdir, gate)

    with c.api() as api:
        r = api.post(f"/v1/jobs/{job}/resume", json={"from": "000042-abcdef"})
    assert r.status_code == 422 and r.json()["field"] == "from"
    assert r.json()["message"] == f"job {job} has no checkpoint '000042-abcdef'"
    refused = c.cli("resume", job, "--from", "000042-abcdef", check=False)
    assert refused.returncode != 0 and "no checkpoint '000042-abcdef'" in refused.stderr + refused.stdout
    assert c.job(job)["state"] == "preempted" and c.job(job)["held"]

    seq = c.job(job)["events"][-1]["seq"]
    c.cli("resume", job, "--from", first)
    j = c.show(job)
    assert j["state"] == "running"
    after = [e for e in j["events"] if e["seq"] > seq]
    assert [(e["kind"], e["detail"]) for e in after] == [
        ("resume_from", f"it resumes from checkpoint {first}"),
        ("released", ""),
        ("restoring", f"on node-1 devices [0], restoring from checkpoint {first}"),
        ("running", f"restored, pids [{j['placement'][0]['pid']}]"),
    ]
    # The newer checkpoint is still there, to be chosen in turn.
    assert [(x["id"], x["state"]) for x in j["checkpoints"]] == [(first, "committed"), (second, "committed")]

    gate.touch()
    assert c.cli("wait", job, check=False).returncode == 0
    assert c.cli("logs", job).stdout.encode() == expected_out
    assert (workdir / "progress.txt").read_bytes() == expected_progress
