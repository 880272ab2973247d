"""A real agent process against a real control plane (served over HTTP): an action the agent cannot read —
an order it does not know how to read, or an action of another protocol version — is not run; the agent
reports it failed with the reason, and the control plane records that result."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from tidal.control import agents
from tidal.control.store.models import ActionRow, NodeRow
from tidal.core import protocol
from tidal.testing.control import Plane
from tidal.testing.server import served


@dataclass
class Live:
    plane: Plane
    node: str
    log: Path

    def add(self, action_id: str, kind: str, payload: dict[str, Any]) -> None:
        """A pending action for the node, as if the control plane had decided it."""
        with self.plane.db.tx() as s:
            s.add(ActionRow(id=action_id, job_id="j-none", node=self.node, kind=kind, op=action_id,
                            status="pending", payload=payload, created_at=time.time()))
            s.info["new_actions"] = {self.node}  # wakes the node's long-poll

    def settled(self, action_id: str, timeout: float = 30) -> ActionRow:
        deadline = time.monotonic() + timeout
        while True:
            with self.plane.db.read() as s:
                row = s.get(ActionRow, action_id)
                assert row is not None
                if row.status in ("done", "failed"):
                    return row
            assert time.monotonic() < deadline, f"no result for {action_id}:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.05)


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    plane = Plane(tmp_path, lease_s=5.0)
    token = tmp_path / "agent.token"
    token.write_text(plane.agent)
    token.chmod(0o600)
    node = f"node-r{os.getpid()}"
    log = tmp_path / "agent.log"
    with served(plane.http.app) as url, log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidal.agent", "--name", node, "--server", url, "--token-file", str(token),
             "--root", str(tmp_path / "root")], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "TIDAL_HOME": str(tmp_path / "home")})
        try:
            def up() -> bool:
                assert proc.poll() is None, log.read_text()
                with plane.db.read() as s:
                    n = s.get(NodeRow, node)
                    return n is not None and n.up

            _until(up, 60, f"{node} to register")
            yield Live(plane, node, log)
        finally:
            proc.terminate()  # the agent leaves: its node is given back
            proc.wait(30)
    plane.db.close()


def test_an_order_the_agent_cannot_read_is_reported_failed_and_not_run(live: Live) -> None:
    # A launch with no command (and none of what a launch needs): the control plane cannot read it either,
    # and hands it out as stored.
    live.add("a-bad", "launch", {"job_id": "j-none", "attempt": 1, "argv": []})
    row = live.settled("a-bad")
    assert row.status == "failed" and row.agent_id is not None
    assert row.result is not None and row.result["ok"] is False
    error = row.result["error"]
    assert error.startswith(f"the agent on {live.node} did not run it: bad action: order.launch.argv: "), error
    assert row.result["corrupt"] is None
    # The agent still runs what it can read.
    live.add("a-good", "kill", {"job_id": "j-none", "attempt": 1})
    row = live.settled("a-good")
    assert row.status == "done" and row.result == {"ok": True, "error": None, "ranks": []}


def test_an_action_of_another_protocol_version_is_reported_failed_and_not_run(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    newer = agents.take_actions

    def take_actions(s: Session, name: str, agent_id: str) -> list[dict[str, Any]]:
        # A control plane of a later release: its actions are of protocol version 2.
        return [{**a, "v": 2} for a in newer(s, name, agent_id)]

    monkeypatch.setattr(agents, "take_actions", take_actions)
    # A kill the agent would carry out (and report done) if it ran it.
    live.add("a-v2", "kill", protocol.encode(protocol.Kill(job_id="j-none", attempt=1)))
    row = live.settled("a-v2")
    assert row.status == "failed" and row.result is not None
    assert row.result["error"].startswith(
        f"the agent on {live.node} did not run it: this action speaks protocol version 2; this Tidal speaks "
        "version 1 (run the same Tidal release on the control plane and its agents"), row.result["error"]
    assert "was not run: this action speaks protocol version 2" in live.log.read_text()
