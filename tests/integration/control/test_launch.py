"""What a launch tells each node: MASTER_ADDR is the address the node of rank 0 advertised (loopback when
no node advertised one: the ranks are on one machine)."""

from __future__ import annotations

from typing import Any

from tidal.testing.control import Plane


def register(p: Plane, name: str, advertise: str | None) -> None:
    body: dict[str, Any] = {"name": name, "agent_id": f"agent-{name}", "devices": 1, "cpus": [[0]]}
    if advertise is not None:
        body["advertise_addr"] = advertise
    r = p.http.post("/v1/agent/register", headers=p.as_agent(), json=body)
    assert r.status_code == 200, r.text


def launches(p: Plane, nodes: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for n in nodes:
        r = p.http.get(f"/v1/agent/{n}/actions", headers=p.as_agent(), params={"agent_id": f"agent-{n}", "wait": 0})
        assert r.status_code == 200, r.text
        (act,) = r.json()
        out[n] = act["order"]
    return out


def test_master_addr_is_the_advertised_address_of_rank_0s_node(plane: Plane) -> None:
    register(plane, "node-1", "198.18.0.10")
    register(plane, "node-2", "198.18.0.11")
    plane.submit(ranks=2)
    plane.rec.once()
    orders = launches(plane, ["node-1", "node-2"])
    first = next(n for n, o in orders.items() if o["ranks"][0]["rank"] == 0)
    want = {"node-1": "198.18.0.10", "node-2": "198.18.0.11"}[first]
    assert {o["master_addr"] for o in orders.values()} == {want}


def test_without_advertised_addresses_the_agent_uses_loopback(plane: Plane) -> None:
    register(plane, "node-1", None)
    plane.submit()
    plane.rec.once()
    assert launches(plane, ["node-1"])["node-1"]["master_addr"] is None
