"""Prints this process's environment as one JSON line (rank 0 of a job writes it as ``env-RANK.json`` too),
to compare what a Tidal rank sees with what a ``torchrun`` worker sees."""

import json
import os

env = dict(os.environ)
print(json.dumps(env, sort_keys=True), flush=True)
with open(f"env-{env.get('RANK', 'none')}.json", "w") as f:
    json.dump(env, f, sort_keys=True)
