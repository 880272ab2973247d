"""The reconcile loop against a real database and API (a scripted agent, no processes): it reads the time
only through its clock, and it runs each live policy the same whatever the policy is called."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tidal.control.reconcile import Reconciler
from tidal.core import Action, ClusterView, Event
from tidal.policy.base import Policy
from tidal.policy.reasons import Reason
from tidal.policy.registry import LIVE_POLICIES, make_live_policy
from tidal.testing.control import FakeAgent, Plane, start


class Skewed:
    """The machine's clocks, with wall time ``ahead`` seconds in the future."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def time(self) -> float:
        return time.time() + self.ahead

    def monotonic(self) -> float:
        return time.monotonic()


class Disguised:
    """A policy under another name: the reconcile loop must not behave differently."""

    def __init__(self, inner: Policy, name: str) -> None:
        self.inner = inner
        self.name = name

    @property
    def grows(self) -> bool:
        return self.inner.grows

    def decide(self, view: ClusterView, events: Sequence[Event], now: float) -> list[Action]:
        return self.inner.decide(view, events, now)

    def next_wakeup(self, now: float) -> float | None:
        return self.inner.next_wakeup(now)

    def reasons(self) -> Mapping[str, Reason]:
        return self.inner.reasons()


def test_leases_run_out_by_the_reconcilers_clock(tmp_path: Path) -> None:
    p = Plane(tmp_path, lease_s=30.0)
    clock = Skewed()
    p.rec = Reconciler(p.db, make_live_policy("firstfit"), clock=clock)
    a = FakeAgent(p, "node-1", "agent-node-1", devices=1)
    assert a.register() == 200
    jid = p.submit()
    start(p, a, jid)
    p.rec.once()
    assert p.job(jid)["state"] == "running"
    clock.ahead = 31.0  # past the lease, by the reconciler's clock only
    p.rec.once()
    (node,) = p.http.get("/v1/nodes", headers=p.as_user()).json()
    assert not node["up"]
    assert p.job(jid)["state"] == "pending"  # requeued: its node was lost
    p.db.close()


def test_periodic_checkpoints_fall_due_by_the_reconcilers_clock(tmp_path: Path) -> None:
    p = Plane(tmp_path)
    clock = Skewed()
    p.rec = Reconciler(p.db, make_live_policy("firstfit"), clock=clock)
    a = FakeAgent(p, "node-1", "agent-node-1", devices=1)
    assert a.register() == 200
    jid = p.submit(checkpoint_every=20)
    start(p, a, jid)
    p.rec.once()
    assert a.actions() == []
    clock.ahead = 21.0
    p.rec.once()
    (act,) = a.actions()
    assert (act["kind"], act["job_id"]) == ("checkpoint", jid)
    p.db.close()


def _passes(tmp: Path, policy: Policy) -> list[list[tuple[str, str, Any]]]:
    """A basic job of one device and then an elastic one of two (it may start on one) on a node of two
    devices; the first finishes, and the reconciler passes again, then once more 10 s later. What the agent
    is sent at each pass (kind, job, devices or what follows the checkpoint)."""
    tmp.mkdir()
    p = Plane(tmp)
    clock = Skewed()
    p.rec = Reconciler(p.db, policy, clock=clock)
    a = FakeAgent(p, "node-1", "agent-node-1", devices=2)
    assert a.register() == 200
    label = {p.submit(tier="basic"): "small", p.submit(tier="basic", ranks=2, min_devices=1): "elastic"}
    small = next(iter(label))
    out = []

    def one_pass() -> None:
        p.rec.once()
        sent = a.actions()
        out.append([(x["kind"], label[x["job_id"]],
                     [r["device"] for r in x["payload"]["ranks"]] if x["kind"] == "launch"
                     else x["payload"].get("then")) for x in sent])
        for x in sent:
            if x["kind"] == "launch":
                assert a.result(x, ranks=[{"rank": r["rank"], "pid": 100 + r["rank"]} for r in x["payload"]["ranks"]])

    one_pass()
    assert a.exit(small, attempt=1, code=0)
    one_pass()
    clock.ahead = 10.0  # past the live policies' minimum run time
    one_pass()
    p.db.close()
    return out


@pytest.mark.parametrize("name", LIVE_POLICIES)
def test_a_live_policy_runs_the_same_under_any_name(tmp_path: Path, name: str) -> None:
    own = _passes(tmp_path / name, make_live_policy(name))
    for alias in sorted({*LIVE_POLICIES, "disguised"} - {name}):  # another live policy's name too
        assert _passes(tmp_path / f"as-{alias}", Disguised(make_live_policy(name), alias)) == own, alias
    if make_live_policy(name).grows:
        # The elastic job starts shrunk (both ranks on the device left), then grows into the one freed
        # although nothing waits (a resize starts with a checkpoint).
        assert own == [[("launch", "small", [0]), ("launch", "elastic", [1, 1])], [],
                       [("checkpoint", "elastic", "kill")]]
    else:
        assert own == [[("launch", "small", [0])], [("launch", "elastic", [0, 1])], []]
