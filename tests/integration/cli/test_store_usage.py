"""`tidal store usage` through the real `tidal` against a real API: exact tables (piped) and the API's JSON."""

from __future__ import annotations

import json
import time

import httpx

from tests.integration.cli.conftest import Served
from tidal.cli.listings import LISTINGS
from tidal.control.store.models import CheckpointRow, CheckpointState


def test_store_usage(served_plane: Served) -> None:
    p = served_plane.plane
    jid = p.submit(name="train")
    other = p.submit(name="eval")
    with p.db.tx() as s:
        for i, (job, size) in enumerate(((jid, 3 * 2**30), (jid, 2**30), (other, 512 * 2**20))):
            s.add(CheckpointRow(id=f"00000{i}-abcdef", job_id=job, created_at=time.time(), bytes=size,
                                stored_bytes=size // 4, retained=True, parts=[f"00000{i}-abcdef"],
                                state=CheckpointState.COMMITTED))
    out = served_plane.cli("store", "usage").stdout
    assert out.splitlines() == [
        "USER   JOBS  CHECKPOINTS  SIZE     STORED   QUOTA",
        "alice  2     3            4.5 GiB  1.1 GiB  -",
        "",
        "JOB" + " " * (len(jid) - 1) + "NAME   OWNER  STATE    CHECKPOINTS  SIZE       STORED",
        f"{jid}  train  alice  pending  2            4.0 GiB    1.0 GiB",
        f"{other}  eval   alice  pending  1            512.0 MiB  128.0 MiB",
    ]
    as_json = json.loads(served_plane.cli("store", "usage", "-o", "json").stdout)
    r = httpx.get(served_plane.url + "/v1/store/usage", headers={"Authorization": f"Bearer {p.user}"}, timeout=30)
    assert as_json == r.json()
    assert as_json == {
        "users": [{"user": "alice", "jobs": 2, "checkpoints": 3, "bytes": 4.5 * 2**30, "stored_bytes": 4.5 * 2**28,
                   "quota": None}],
        "jobs": [{"job": jid, "name": "train", "owner": "alice", "state": "pending", "checkpoints": 2,
                  "bytes": 4 * 2**30, "stored_bytes": 2**30},
                 {"job": other, "name": "eval", "owner": "alice", "state": "pending", "checkpoints": 1,
                  "bytes": 512 * 2**20, "stored_bytes": 128 * 2**20}],
    }
    assert list(as_json) == list(LISTINGS["store usage"].fields)
    assert list(as_json["users"][0]) == list(LISTINGS["store usage: users"].fields)
    assert list(as_json["jobs"][0]) == list(LISTINGS["store usage: jobs"].fields)
