"""`tidal node drain|undrain` (an admin's) and `tidal nodes` saying which nodes are drained and why: the `tidal`
command against a real HTTP API (the control plane in-process, scripted agents)."""

from __future__ import annotations

import json
import re

from tests.integration.cli.conftest import Served
from tidal.control import drains, tokens
from tidal.control.clock import now
from tidal.control.store.models import NodeRow
from tidal.testing.control import FakeAgent


def cells(line: str) -> list[str]:  # a pipe gets plain rows, columns apart by two spaces or more
    return re.split(r"\s{2,}", line.strip())


def table(served_plane: Served) -> dict[str, str]:
    """Node → its DRAINED cell in `tidal nodes`."""
    lines = served_plane.cli("nodes", env={"COLUMNS": "250"}).stdout.splitlines()
    assert cells(lines[0])[-1] == "DRAINED", lines[0]
    return {cells(line)[0]: cells(line)[-1] for line in lines[1:]}


def test_nodes_say_which_are_drained_and_why(served_plane: Served) -> None:
    p = served_plane.plane
    for name in ("node-1", "node-2"):
        assert FakeAgent(p, name, f"{name}-agent").register() == 200
    with p.db.tx() as s:
        admin = {"TIDAL_TOKEN": tokens.create_user(s, "root", "admin")}
    assert table(served_plane) == {"node-1": "-", "node-2": "-"}

    refused = served_plane.cli("node", "drain", "node-1", check=False)
    assert refused.returncode != 0 and "error: this needs an admin token" in refused.stderr, refused.stderr
    out = served_plane.cli("node", "drain", "node-1", "--reason", "disk swap", env=admin).stdout
    reason = "drained by root: disk swap; until `tidal node undrain node-1`"
    assert out.strip() == f"node node-1 drained: {reason}"
    assert table(served_plane) == {"node-1": reason, "node-2": "-"}
    assert served_plane.cli("node", "undrain", "node-1", env=admin).stdout.strip() == "node node-1 undrained"

    # node-2 loses its lease three times within 10 minutes: drained by itself.
    with p.db.tx() as s:
        row = s.get(NodeRow, "node-2")
        assert row is not None
        for k in range(3):
            drains.lease_lost(s, row, now(s) + k, "test")
    auto = "lease lost 3 times in 10 min; until healthy for 10 min"
    assert table(served_plane) == {"node-1": "-", "node-2": auto}
    listed = {n["name"]: n for n in json.loads(served_plane.cli("nodes", "-o", "json").stdout)}
    assert (listed["node-2"]["drained"], listed["node-2"]["drain_reason"]) == ("lease", auto)
    assert listed["node-1"]["drained"] is None and listed["node-1"]["drain_reason"] is None
