"""A migration whose target pre-stages the job's last checkpoint, on a real cluster: the job comes back with
output identical to an uninterrupted run, and the restore fetched a small part of its images from the store
(the rest came from what the target fetched while the job was checkpointed), where the first migration, with
nothing to pre-stage, fetched them all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.cluster import LiveCluster
from tidal.testing import wait_until

pytestmark = pytest.mark.criu

# Deterministic: 48 MiB of seeded random bytes (an image worth pre-staging), then numbered steps whose values
# read them, a file it appends to, and a gate (outside its working directory) holding it at step 40.
HOLDER = r"""
import os, random, sys, time
blob = random.Random(7).randbytes(48 << 20)
gate = os.environ["GATE"]
for i in range(1, 81):
    print(f"step {i} value {blob[(i * 7919) % len(blob)]}", flush=True)
    with open("progress.txt", "a") as f:
        f.write(f"{i}\n")
    while i >= 40 and not os.path.exists(gate):
        time.sleep(0.05)
    time.sleep(0.02)
print("done")
"""
RESTORED = re.compile(r"job (\S+) restored from checkpoint (\S+): fetched ([\d.]+) MiB of ([\d.]+) MiB of images "
                      r"from the store in [\d.]+s \(([^)]*)\)")


def restores(c: LiveCluster, node: str, job: str) -> list[tuple[str, float, float, str]]:
    """(checkpoint, MiB fetched, MiB of images, how) of each restore of ``job`` in ``node``'s agent log."""
    text = (c.home / "logs" / f"{node}.log").read_text(errors="replace")
    return [(m[2], float(m[3]), float(m[4]), m[5]) for m in RESTORED.finditer(text) if m[1] == job]


def migrated(c: LiveCluster, job: str, to: str) -> dict[str, object]:
    c.cli("migrate", job, "--to", to)
    j = c.wait_state(job, "running", timeout=120)
    assert j["placement"][0]["node"] == to
    return j


def test_a_migration_back_restores_from_what_its_target_prestaged(make_cluster, workdir: Path, gate: Path,
                                                                   tmp_path: Path) -> None:
    c = make_cluster(nodes=2, devices=1)
    ref = tmp_path / "reference"
    ref.mkdir()
    (tmp_path / "open").touch()
    expected = subprocess.run([sys.executable, "-c", HOLDER], cwd=ref, env={"GATE": str(tmp_path / "open")},
                              capture_output=True, check=True, timeout=120).stdout

    job = c.cli("submit", "--env", "GATE", "--quiet", "--", sys.executable, "-c", HOLDER, cwd=workdir,
                env={"GATE": str(gate)}).stdout.strip()
    first = c.wait_state(job, "running")["placement"][0]["node"]
    other = next(n for n in c.state.agents if n != first)
    progress = workdir / "progress.txt"
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 5, timeout=60, what="progress")

    # Away: nothing to pre-stage (no checkpoint yet); the restore fetches every image.
    migrated(c, job, other)
    ((ck1, fetched1, total1, how1),) = restores(c, other, job)
    assert how1 == "nothing prestaged" and total1 > 48 and fetched1 > 0.9 * total1

    # Back: the target pre-stages that checkpoint while the job is checkpointed on the other node.
    j = migrated(c, job, first)
    (ev,) = [e for e in j["events"] if e["kind"] == "prestaged"]
    assert ev["node"] == first and f"checkpoint {ck1}," in ev["detail"], ev
    assert not [e for e in j["events"] if e["kind"] == "prestage_failed"]
    ((_, fetched2, total2, how2),) = restores(c, first, job)
    assert how2.startswith("prestaged from checkpoint ")
    assert total2 > 48 and fetched2 < 0.25 * total2, (fetched2, total2)

    gate.touch()
    done = c.cli("wait", job, check=False, timeout=180)
    assert done.returncode == 0, done.stderr
    assert c.cli("logs", job).stdout.encode() == expected
    assert progress.read_text() == "".join(f"{i}\n" for i in range(1, 81))
