"""A command that ends at once is seen to end: the rank's init must not miss its child's exit, and if an init
ever does, the agent's watchdog ends the rank."""

from __future__ import annotations

import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.ranks import Cluster
from tidal.agent.executor import Watchdog
from tidal.mechanisms.criu.rank import RankProcess, RankSpec
from tidal.testing import wait_until

STARTS = 300


def test_commands_that_end_at_once_are_always_reaped(cluster: Cluster) -> None:
    # Half exit 0 at once; half fail to exec (the child's quickest possible end). Each must be reported
    # within seconds, with its own code.
    argvs = [("/bin/true",), ("/nonexistent/tidal-no-such-command",)]

    def one(i: int) -> tuple[int, int | None, float]:
        spec = RankSpec(f"quick{i}", 0, argvs[i % 2], cluster.workdir, {}, interpose=False)
        t0 = time.monotonic()
        rank = RankProcess.launch(spec, cluster.nodes[i % 3])
        code = rank.wait(15).code
        return i, code, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, range(STARTS)))
    assert [code for _, code, _ in results] == [0 if i % 2 == 0 else 127 for i in range(STARTS)]
    assert max(took for _, _, took in results) < 15


def test_the_watchdog_ends_a_rank_whose_init_missed_its_commands_end(cluster: Cluster,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # An init that cannot run (stopped here) never reports its command's end: without the watchdog the job
    # would stay running, holding its devices, forever.
    spec = RankSpec("stuck", 0, ("sh", "-c", "read _ < /dev/null; sleep 0.5"), cluster.workdir, {},
                    interpose=False)
    rank = RankProcess.launch(spec, cluster.nodes[0])
    os.kill(rank.pid, signal.SIGSTOP)
    wait_until(rank.command_gone, timeout=30, what="the command to end under the stopped init", interval=0.01)
    dog = Watchdog(every=0.05, nudge_after=0.2, kill_after=1.0)

    def ended() -> bool:
        if rank.poll() is not None:
            return True
        dog.check([rank])
        return False

    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tidal.agent.executor"):
        wait_until(ended, timeout=30, what="the watchdog to end the rank", interval=0.02)
    assert rank.wait(5).signal == signal.SIGKILL
    assert time.monotonic() - t0 < 5
    assert "rank stuck.r0: its command ended and its init has not reported it; waking the init" in caplog.text
    assert "its init did not report it; killing the rank" in caplog.text


def test_the_watchdog_leaves_running_ranks_alone(cluster: Cluster) -> None:
    # Also right after the launch, before the init has forked the command: not for long enough to count.
    spec = RankSpec("busy", 0, ("sleep", "3"), cluster.workdir, {}, interpose=False)
    rank = RankProcess.launch(spec, cluster.nodes[0])
    dog = Watchdog(every=0.0, nudge_after=0.5, kill_after=1.0)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2:
        dog.check([rank])
        time.sleep(0.02)
    assert rank.wait(30).code == 0
