"""What a rank does with /dev/shm around a checkpoint: a shared-memory file it holds by name at the dump and
removes afterwards (torch's DataLoader workers do so for every batch) is back at restore, and a rank killed
by its checkpoint runs nothing past the dump."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from tests.integration.ranks import Cluster
from tidal.mechanisms.criu.job import Job
from tidal.testing import wait_for_line

# Creates a shared-memory file and maps it, then waits; once "go" exists it prints what the mapping holds
# and removes the file's name (as torch does right after creating one), keeping the mapping.
SHM_HOLDER = """
import mmap, os, sys, time
path = "/dev/shm/" + sys.argv[1]
fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.ftruncate(fd, 8192)
m = mmap.mmap(fd, 8192)
m[:5] = b"hello"
m[4096:4101] = b"world"
print("ready", flush=True)
while not os.path.exists("go"):
    time.sleep(0.01)
print("holds", bytes(m[:5]).decode(), bytes(m[4096:4101]).decode(), flush=True)
m[:5] = b"HELLO"
os.unlink(path)
print("removed", flush=True)
"""

# Counts as fast as it can into a file outside the working directory (not put back by a restore).
SPINNER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
print("spinning", flush=True)
n = 0
while True:
    n += 1
    os.pwrite(fd, b"%020d" % n, 0)
"""


def test_a_shm_file_removed_after_a_periodic_checkpoint_is_back_at_restore(cluster: Cluster) -> None:
    name = f"tidal-test-{uuid.uuid4().hex}"
    shm = Path("/dev/shm") / name
    spec = cluster.spec([sys.executable, "-c", SHM_HOLDER, name])
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    try:
        log = cluster.nodes[0].log_path(spec)
        wait_for_line(log, r"^ready$")
        info = job.checkpoint(then="continue")  # the file still has its name: CRIU records it by name
        (cluster.workdir / "go").touch()
        assert [s.code for s in job.wait(60)] == [0]
        assert log.read_text().splitlines()[-2:] == ["holds hello world", "removed"]
        assert not shm.exists()
        # Restored before "go" (the restore removes it from the working directory): its file is back, with
        # what it held at the checkpoint.
        job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], checkpoint_id=info.id)
        assert shm.read_bytes()[:5] == b"hello"
        (cluster.workdir / "go").touch()
        assert [s.code for s in job.wait(60)] == [0]
        assert cluster.nodes[1].log_path(spec).read_text().splitlines() == ["ready", "holds hello world", "removed"]
        assert not shm.exists()
    finally:
        job.kill()
        shm.unlink(missing_ok=True)


def test_a_frozen_rank_that_is_killed_runs_no_further(cluster: Cluster) -> None:
    # What a checkpoint that kills does once the dump is committed. Only the rank's init used to be signalled
    # before the frozen rank was thawed: its command ran on until the kernel tore the namespace down, past
    # the state just dumped (that race was lost most times, hence a few rounds).
    counter = cluster.root / "counter"
    spec = cluster.spec([sys.executable, "-c", SPINNER, str(counter)])
    for _ in range(3):
        job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
        wait_for_line(cluster.nodes[0].log_path(spec), r"^spinning$")
        rank = job.ranks[0]
        rank.freeze()
        at_freeze = counter.read_bytes()
        rank.kill()
        assert rank.wait(30).signal == 9
        assert counter.read_bytes() == at_freeze
