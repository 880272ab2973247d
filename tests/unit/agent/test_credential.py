"""The node's own credential, as its agent keeps it: owner-only in the node root, replaced atomically."""

from __future__ import annotations

import stat
from pathlib import Path

from tidal.agent import credential


def test_the_credential_is_kept_owner_only(tmp_path: Path) -> None:
    root = tmp_path / "node"
    assert credential.stored(root) is None
    p = credential.store(root, "tdl_one")
    assert p == root / "agent.token" and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert credential.stored(root) == "tdl_one"
    credential.store(root, "tdl_two")  # joined again: the new credential replaces the old
    assert credential.stored(root) == "tdl_two" and sorted(x.name for x in root.iterdir()) == ["agent.token"]
