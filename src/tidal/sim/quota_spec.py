"""``--quota``: per-project quotas for admitting premium and standard jobs.

Either ``project=share,...`` (shares of the devices; ``*=share`` for every project not named), or a VC
CSV (``vc,node num``, as the Helios artifact's ``philly_vc.csv``): each VC, a project of the Philly
trace, gets the share of the nodes it had in Philly, where virtual clusters were exactly that — each
team's guaranteed part of the machines. ``scale`` multiplies every share (e.g. 0.8: promise at most
80 % of the devices).
"""

from __future__ import annotations

import os

from tidal.errors import ValidationError
from tidal.policy.admission import Quotas, parse_quotas
from tidal.sim.cluster_spec import read_vc_csv


def parse_quota_option(text: str, scale: float = 1.0) -> Quotas:
    if not 0.0 < scale <= 1.0:
        raise ValidationError(f"--quota-scale must be in (0, 1], got {scale}", field="quota_scale",
                              hint="pass a --quota-scale above 0 and at most 1, e.g. 0.8")
    if os.path.exists(text):
        rows = read_vc_csv(text, field="quota")
        nodes = sum(n for _, n in rows)
        if nodes == 0:
            raise ValidationError(f"{text}: every VC has 0 nodes", field="quota",
                                  hint="give some virtual cluster of the file nodes, or pass project=share,...")
        return Quotas({vc: scale * n / nodes for vc, n in rows})
    if "=" not in text:
        raise ValidationError(f"--quota {text!r} is neither project=share,... nor an existing file",
                              field="quota", hint="e.g. --quota 'vision=0.4,*=0.1' or --quota philly_vc.csv")
    q = parse_quotas(text)
    return Quotas({p: s * scale for p, s in q.shares.items()})
