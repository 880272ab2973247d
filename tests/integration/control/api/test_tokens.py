"""Join tokens and node credentials through the API: an admin creates, lists and revokes them; a node's
agent exchanges a join token, once, for the node's own credential; what is revoked, expired, used or
another node's is refused with a message saying which."""

from __future__ import annotations

from typing import Any

from tidal.control import tokens
from tidal.control.store.models import NodeRow
from tidal.testing import FakeClock
from tidal.testing.control import Plane


def _admin(plane: Plane) -> dict[str, str]:
    with plane.db.tx() as s:
        token = tokens.create_user(s, "root", "admin")
    return {"Authorization": f"Bearer {token}"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _register(plane: Plane, token: str, node: str, **extra: Any) -> Any:
    return plane.http.post("/v1/agent/register", headers=_bearer(token), json={
        "name": node, "agent_id": f"a-{node}", "devices": 1, "cpus": [[0]], **extra})


def _join(plane: Plane, join_token: str, node: str) -> Any:
    return plane.http.post("/v1/agent/join", headers=_bearer(join_token), json={"name": node})


def test_a_join_token_is_exchanged_once_for_the_nodes_own_credential(plane: Plane) -> None:
    admin = _admin(plane)
    r = plane.http.post("/v1/tokens", headers=admin, json={"node": "gpu-1", "ttl": 600})
    assert r.status_code == 201, r.text
    created = r.json()
    join_token = created["token"]
    assert join_token.startswith("tdj_") and created["node"] == "gpu-1" and created["id"].startswith("jt-")

    # Another node's name with it: refused, and said so.
    other = _join(plane, join_token, "gpu-2")
    assert other.status_code == 403 and other.json()["message"] == f"join token {created['id']} is for node gpu-1, " \
                                                                    "not gpu-2"
    r = _join(plane, join_token, "gpu-1")
    assert r.status_code == 200, r.text
    credential = r.json()["token"]
    assert credential.startswith("tdl_") and credential != join_token
    again = _join(plane, join_token, "gpu-1")
    assert again.status_code == 403 and "already used" in again.json()["message"]
    # The join token is no credential, and the credential registers its own node only.
    assert _register(plane, join_token, "gpu-1").status_code == 401
    assert _register(plane, credential, "gpu-1", advertise_addr="10.1.2.3").status_code == 200
    assert _register(plane, credential, "gpu-9").status_code == 403
    nodes = plane.http.get("/v1/nodes", headers=plane.as_user()).json()
    assert [(n["name"], n["address"]) for n in nodes] == [("gpu-1", "10.1.2.3")]

    listed = {t["id"]: t for t in plane.http.get("/v1/tokens", headers=admin).json()}
    assert listed[created["id"]]["state"] == "used" and listed[created["id"]]["used_at"] is not None
    assert listed["gpu-1"]["kind"] == "node" and listed["cluster"]["kind"] == "cluster"
    assert not any("token" in t for t in listed.values())  # never a secret, nor its hash


def test_revoking_a_nodes_credential_fails_its_agents_next_call(plane: Plane) -> None:
    admin = _admin(plane)
    join_token = plane.http.post("/v1/tokens", headers=admin, json={"node": "n1"}).json()["token"]
    credential = _join(plane, join_token, "n1").json()["token"]
    assert _register(plane, credential, "n1").status_code == 200
    hb = plane.http.post("/v1/agent/n1/heartbeat", headers=_bearer(credential), json={"agent_id": "a-n1"})
    assert hb.status_code == 200  # and the credential is now known to the API's cache

    r = plane.http.delete("/v1/nodes/n1/credential", headers=admin)
    assert r.status_code == 200 and r.json() == {"node": "n1", "credential": True, "join_tokens": []}
    hb = plane.http.post("/v1/agent/n1/heartbeat", headers=_bearer(credential), json={"agent_id": "a-n1"})
    assert hb.status_code == 401 and "revoked" in hb.json()["message"]

    # A new join token joins the node again, with a new credential.
    join_token = plane.http.post("/v1/tokens", headers=admin, json={"node": "n1"}).json()["token"]
    fresh = _join(plane, join_token, "n1").json()["token"]
    assert _register(plane, fresh, "n1").status_code == 200


def test_revoked_expired_and_unknown_join_tokens_are_refused(plane: Plane) -> None:
    admin = _admin(plane)
    clock = FakeClock(2_000_000_000.0)
    plane.db.info["clock"] = clock
    revoked = plane.http.post("/v1/tokens", headers=admin, json={"node": "n1"}).json()
    r = plane.http.delete(f"/v1/tokens/{revoked['id']}", headers=admin)
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    r = _join(plane, revoked["token"], "n1")
    assert r.status_code == 403 and r.json()["message"] == f"join token {revoked['id']} for node n1 was revoked"

    short = plane.http.post("/v1/tokens", headers=admin, json={"node": "n1", "ttl": 60}).json()
    clock.advance(61)
    r = _join(plane, short["token"], "n1")
    assert r.status_code == 403 and "expired" in r.json()["message"]
    r = _join(plane, "tdj_not-a-token", "n1")
    assert r.status_code == 401 and r.json()["message"] == "unknown join token"
    # A node's unused join tokens are revoked with its credential.
    pending = plane.http.post("/v1/tokens", headers=admin, json={"node": "n2"}).json()
    r = plane.http.delete("/v1/nodes/n2/credential", headers=admin)
    assert r.json() == {"node": "n2", "credential": False, "join_tokens": [pending["id"]]}
    assert _join(plane, pending["token"], "n2").status_code == 403
    states = {t["id"]: t["state"] for t in plane.http.get("/v1/tokens", headers=admin).json()}
    assert states == {revoked["id"]: "revoked", short["id"]: "expired", pending["id"]: "revoked",
                      "cluster": "active"}


def test_tokens_are_for_admins_and_bounded(plane: Plane) -> None:
    admin = _admin(plane)
    for method, path, body in (("POST", "/v1/tokens", {"node": "n1"}), ("GET", "/v1/tokens", None),
                               ("DELETE", "/v1/tokens/jt-1", None), ("DELETE", "/v1/nodes/n1/credential", None),
                               ("DELETE", "/v1/nodes/n1", None)):
        for who in (plane.as_user(), plane.as_agent()):
            r = plane.http.request(method, path, headers=who, json=body)
            assert r.status_code == 403 and r.json()["message"] == "this needs an admin token", (path, r.text)
    for body, field in (({"node": "cluster"}, "node"), ({"node": "alice"}, "node"), ({"node": "n/1"}, "node"),
                        ({"node": "n1", "ttl": 0}, "ttl"), ({"node": "n1", "ttl": 10 * 365 * 86400}, "ttl")):
        r = plane.http.post("/v1/tokens", headers=admin, json=body)
        assert r.status_code in (409, 422) and r.json()["field"] == field, (body, r.text)
    assert plane.http.delete("/v1/tokens/jt-nope", headers=admin).status_code == 404
    assert plane.http.delete("/v1/nodes/nope", headers=admin).status_code == 404
    bad = _register(plane, plane.agent, "n1", advertise_addr="not an address")
    assert bad.status_code == 422 and bad.json()["field"] == "advertise_addr"


def test_removing_a_node_waits_for_its_lease(plane: Plane) -> None:
    admin = _admin(plane)
    clock = FakeClock(2_000_000_000.0)
    plane.db.info["clock"] = clock
    credential = _join(plane, plane.http.post("/v1/tokens", headers=admin, json={"node": "n1"}).json()["token"],
                       "n1").json()["token"]
    assert _register(plane, credential, "n1").status_code == 200
    r = plane.http.delete("/v1/nodes/n1", headers=admin)
    assert r.status_code == 200, r.text
    assert r.json() == {"node": "n1", "credential": True, "join_tokens": [], "removed": False, "up": True,
                        "lease_left_s": 30.0}
    assert _register(plane, credential, "n1").status_code == 401
    clock.advance(31)  # the lease runs out: its jobs would be requeued now, and the node may go
    r = plane.http.delete("/v1/nodes/n1", headers=admin)
    assert r.json() == {"node": "n1", "credential": False, "join_tokens": [], "removed": True}
    with plane.db.read() as s:
        assert s.get(NodeRow, "n1") is None
    assert plane.http.delete("/v1/nodes/n1", headers=admin).status_code == 404
