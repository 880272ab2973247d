"""`tidal ls` and `tidal show` say why a job waits: the installed `tidal` command against a real HTTP API (the
control plane in-process, the live policy, a scripted agent)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tidal.control.reconcile import Reconciler
from tidal.policy.registry import make_live_policy
from tidal.testing.control import FakeAgent, Plane
from tidal.testing.server import served

TIDAL = Path(sys.executable).parent / "tidal"
ELASTIC = "needs 2 free device(s) (an elastic job starts on at least 50% of its 4), 1 free"


def test_ls_and_show_give_the_reason_a_job_waits(tmp_path: Path) -> None:
    p = Plane(tmp_path)
    p.rec = Reconciler(p.db, make_live_policy())
    a = FakeAgent(p, "node-1", "A", devices=4)
    assert a.register() == 200
    big = p.submit(name="big", ranks=3)
    p.rec.once()
    (launch,) = a.actions()
    assert a.result(launch, ranks=[{"rank": r, "pid": 10 + r} for r in range(3)])
    waiting = p.submit(name="elastic", ranks=4, min_devices=1)
    p.rec.once()
    env = {"PATH": os.environ["PATH"], "TIDAL_TOKEN": p.user, "TIDAL_HOME": str(tmp_path / "cli"), "COLUMNS": "250"}
    with served(p.http.app) as url:
        def tidal(*args: str) -> list[str]:
            out = subprocess.run([str(TIDAL), *args], capture_output=True, text=True, timeout=60,
                                 env={**env, "TIDAL_URL": url}, check=False)
            assert out.returncode == 0, out.stderr
            return out.stdout.splitlines()

        def cells(line: str) -> list[str]:  # a pipe gets plain rows, columns apart by two spaces or more
            return re.split(r"\s{2,}", line.strip())

        lines = tidal("ls")
        header = cells(lines[0])
        assert header[-1] == "REASON", header
        assert cells(next(line for line in lines if waiting in line))[-1] == ELASTIC
        assert cells(next(line for line in lines if big in line))[-1] == "-"  # running: no reason
        assert f"waiting: {ELASTIC}" in tidal("show", waiting)
        listed = {j["id"]: j for j in json.loads("\n".join(tidal("ls", "-o", "json")))}
        assert (listed[waiting]["reason"], listed[big]["reason"]) == (ELASTIC, None)
    p.db.close()
