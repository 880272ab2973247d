"""Two regions of test hosts, each with its own SeaweedFS, their link capped at 200 Mbit/s and 40 ms away (each
store reached from the other region through a relay that delays each way): a job moved to the
other region has its last checkpoint copied ahead and then only what changed, resumes there and finishes
byte-identical to an uninterrupted run; a region's store going down leaves the jobs running in it running
(their checkpoints fail and say why) and the other region's jobs checkpointing as before; a node cut off
from everything fences its job, which resumes in the other region from the store of its own."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from tests.system.cluster import JOB, reference_run
from tidal.mechanisms.storage import CheckpointStore
from tidal.testing import pid_alive, wait_until
from tidal.testing.hostcluster import HostCluster
from tidal.testing.hosts import TestNet

pytestmark = [pytest.mark.criu, pytest.mark.slow, pytest.mark.postgres, pytest.mark.s3]

HOSTS = [["cp", "db", "s3w", "s3e", "w1", "e1"]]
REGIONS = {"west": ("s3w", ["w1"]), "east": ("s3e", ["e1"])}
OTHER = {"west": "east", "east": "west"}
LINK = "200mbit"  # between the regions: each host of one to each host of the other
LEASE = 15.0
DELAY = 0.04  # each way between the regions
_CROSSED = re.compile(r"checkpoint (\S+) copied from region (\S+) to (\S+): (\d+) chunk\(s\)")


def _progress(workdir: Path) -> int:
    p = workdir / "progress.txt"
    return len(p.read_text().split()) if p.exists() else 0


def _store(cluster: HostCluster, region: str) -> CheckpointStore:
    weed = cluster.region_s3[region]
    return CheckpointStore(cluster.region_store_url(region), key=weed.access_key, secret=weed.secret_key)


def _chunks(store: CheckpointStore, job: str, part: str) -> set[str]:
    reader = store.reader(job, part)
    return {h for name in reader.names() for h, _ in reader.entry(name).chunks}


@pytest.mark.parametrize("test_net", HOSTS, indirect=True)
def test_two_regions_over_a_capped_link(test_net: TestNet, tmp_path: Path) -> None:
    net = test_net
    cluster = HostCluster(net, regions=REGIONS, lease=LEASE, devices=1, region_delay=DELAY)
    diag = cluster.diagnostics
    for region, far in cluster.region_far.items():  # the far endpoint answers a round trip late
        t0 = time.monotonic()
        httpx.get(far, timeout=10)
        assert time.monotonic() - t0 >= 2 * DELAY, region
    for a in ("s3w", "w1"):
        for b in ("s3e", "e1"):
            net.cap(net[a], net[b], LINK)
    nodes = {n["name"]: n for n in cluster.api().get("/v1/nodes").json()}
    assert {n: (v["region"], v["cluster"]) for n, v in nodes.items()} == {"w1": ("west", "west"),
                                                                       "e1": ("east", "east")}
    expected_out, expected_progress = reference_run(tmp_path)
    gate = net.shared / "gate"
    work = net.shared / "work"
    work.mkdir()
    job = cluster.submit(["sh", "-c", JOB], cwd=work, options=["--env", f"GATE={gate}", "--checkpoint-every", "3s"])
    ((node, pid),) = cluster.running_on(job).values()
    first = cluster.region_of[node]
    wait_until(lambda: cluster.job(job)["checkpoints"], timeout=60, what="a periodic checkpoint")
    wait_until(lambda: _progress(work) >= 3, timeout=30, what="progress")

    # To the other region: its last checkpoint crosses ahead, then what the move's checkpoint adds.
    cluster.cli("migrate", job, "--to-region", OTHER[first])
    ((moved_node, moved_pid),) = cluster.running_on(job).values()
    assert cluster.region_of[moved_node] == OTHER[first] and not pid_alive(pid)
    j = cluster.job(job)
    copies = {("ahead of the move" in e["detail"]): (m.group(1), int(m.group(4))) for e in j["events"]
              if e["kind"] == "replicated" and (m := _CROSSED.search(e["detail"]))}
    assert set(copies) == {True, False}, (j["events"], diag())
    (ahead, ahead_chunks), (moved, moved_chunks) = copies[True], copies[False]
    source = _store(cluster, first)
    try:
        last, taken = _chunks(source, job, ahead), _chunks(source, job, moved)
    finally:
        source.close()
    assert ahead_chunks == len(last)
    assert moved_chunks == len(taken - last) < len(taken)
    # Copied across the far link: through the relay, not the store's own address.
    assert f"from {cluster.region_store_url(first, far=True)}" in cluster.agents[moved_node].log.read_text()

    # The first region's store fails. The job, now in the other region, checkpoints on into its own; a job
    # in the first region goes on running, and its checkpoint fails with the reason.
    cluster.region_s3[first].shutdown(kill=True)
    there = [n for n, r in cluster.region_of.items() if r == first]
    stay = cluster.submit(["sleep", "600"], cwd=work, options=["--region", first])
    ((stay_node, stay_pid),) = cluster.running_on(stay).values()
    assert stay_node in there
    refused = cluster.cli("preempt", stay, check=False)
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0 and "checkpoint store error" in said, said
    assert cluster.running_on(stay) == {0: (stay_node, stay_pid)} and pid_alive(stay_pid)
    before = {c["id"] for c in cluster.job(job)["checkpoints"]}
    wait_until(lambda: {c["id"] for c in cluster.job(job)["checkpoints"]} - before, timeout=60,
               what="a checkpoint of the moved job committed in its region's store", hint=diag())
    assert cluster.running_on(job) == {0: (moved_node, moved_pid)}

    cluster.region_s3[first].start()
    cluster.cli("cancel", stay)

    # The moved job's node is cut off: its agent fences the rank, the control plane requeues the job once
    # the lease is out, and it resumes in the first region from its newest checkpoint, which that region's
    # node copies from the other region's store (reachable: only the node was cut off).
    net[moved_node].link_down()
    wait_until(lambda: not pid_alive(moved_pid), timeout=LEASE * 2, what="the cut-off node's agent to fence the "
               "rank", hint=diag())
    ((back_node, _),) = cluster.running_on(job, timeout=120).values()
    assert cluster.region_of[back_node] == first
    j = cluster.job(job)
    assert any(f"node {moved_node} lost" in (e["detail"] or "") for e in j["events"]), j["events"]
    assert any(e["kind"] == "replicated" and f"to {first}:" in e["detail"] for e in j["events"]), j["events"]
    gate.touch()
    assert cluster.cli("wait", job, check=False).returncode == 0, diag()
    assert cluster.cli("logs", job).stdout.encode() == expected_out
    assert (work / "progress.txt").read_bytes() == expected_progress
