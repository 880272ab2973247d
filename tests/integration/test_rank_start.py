"""A command that ends at once is seen to end: the rank's init must not miss its child's exit."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tests.integration.conftest import Cluster
from tidal.mechanisms.criu.rank import RankProcess, RankSpec

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
