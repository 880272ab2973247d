"""The API refuses a job's submission with a key it does not know (the closest valid one suggested) or a bad
value, with a 422 naming the key as the caller sent it; nothing is submitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.testing.control import Plane

KEYS = "valid keys: command, workdir, name, tier, ranks, min_devices, max_devices, env, checkpoint_every, runtime, " \
       "max_restarts, project, region, cluster"


@pytest.mark.parametrize(("extra", "field", "message", "hint"), [
    ({"rankz": 4}, "rankz", "unknown key 'rankz' in the job's submission: did you mean 'ranks'?", KEYS),
    ({"checkpoint_evry": 60}, "checkpoint_evry",
     "unknown key 'checkpoint_evry' in the job's submission: did you mean 'checkpoint_every'?", KEYS),
    ({"owner": "mallory"}, "owner", "unknown key 'owner' in the job's submission", KEYS),
    ({"tier": "premum"}, "tier", "unknown tier 'premum': did you mean 'premium'?",
     "valid tiers: premium, standard, basic"),
    ({"tier": "gold"}, "tier", "unknown tier 'gold'", "valid tiers: premium, standard, basic"),
    ({"ranks": 4, "min_devices": 3, "max_devices": 2}, "min_devices", "min_devices (3) must be ≤ max_devices (2)",
     None),
])
def test_a_bad_submission_is_refused_naming_the_key(plane: Plane, extra: dict[str, Any], field: str, message: str,
                                                     hint: str | None) -> None:
    r = plane.http.post("/v1/jobs", headers=plane.as_user(),
                        json={"command": ["train"], "workdir": str(plane.workdir), **extra})
    assert r.status_code == 422, r.text
    assert r.json() == {"error": "ValidationError", "message": message, "hint": hint, "field": field}
    assert plane.http.get("/v1/jobs", headers=plane.as_user()).json() == []


def test_a_good_submission_still_goes_through(plane: Plane, tmp_path: Path) -> None:
    plane.add_projects("vision")
    r = plane.submit_reply(tier="premium", ranks=2, min_devices=1, checkpoint_every=60, project="vision")
    assert r["tier"] == "premium" and r["name"] == "train"
