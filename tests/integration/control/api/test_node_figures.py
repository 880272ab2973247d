"""What an agent's heartbeat says of its node (its staging usage) is exported on GET /metrics per node, from
the node's holder only."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tidal.control import tokens
from tidal.testing.control import FakeAgent, Plane


def staging(p: Plane, token: str) -> dict[tuple[str, str], float]:
    r = p.http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return {(s.labels["node"], s.labels["medium"]): s.value for fam in text_string_to_metric_families(r.text)
            for s in fam.samples if s.name == "tidal_node_staging_bytes"}


def test_heartbeats_staging_usage_is_a_gauge_per_node_and_medium(plane: Plane) -> None:
    with plane.db.tx() as s:
        scraper = tokens.create_user(s, "prometheus", "metrics")
    assert FakeAgent(plane, "node-1", "A1").register() == 200
    assert staging(plane, scraper) == {}

    def beat(agent_id: str, figures: dict[str, float], node: str = "node-1") -> int:
        r = plane.http.post(f"/v1/agent/{node}/heartbeat", headers=plane.as_agent(),
                            json={"agent_id": agent_id, "node": figures})
        return r.status_code

    assert beat("A1", {"staging_memory_bytes": 3 << 20, "staging_disk_bytes": 0}) == 200
    assert staging(plane, scraper) == {("node-1", "memory"): 3 << 20, ("node-1", "disk"): 0.0}
    assert beat("A1", {"staging_memory_bytes": 1 << 20, "staging_disk_bytes": 5 << 20}) == 200
    assert staging(plane, scraper) == {("node-1", "memory"): 1 << 20, ("node-1", "disk"): 5 << 20}
    # An agent that does not hold the node is refused, and what it says is not taken.
    assert beat("A-stale", {"staging_memory_bytes": 9 << 20}) == 409
    assert staging(plane, scraper)[("node-1", "memory")] == 1 << 20
    # Too many figures: refused as bad input, as the job figures are.
    assert beat("A1", {f"f{i}": 1.0 for i in range(33)}) == 422
