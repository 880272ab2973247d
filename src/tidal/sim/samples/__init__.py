"""Sample traces shipped with Tidal, so that the simulator runs from an installed package: ``tidal sim --trace
sample:philly-week`` (see README.md here for where they come from and their licences)."""

from __future__ import annotations

from pathlib import Path

from tidal.errors import ValidationError

PREFIX = "sample:"

#: name -> (file here, what it holds)
SAMPLES = {
    "philly-week": ("philly-week.csv.xz", "one week of Microsoft's Philly trace (11,386 jobs, 2017-10-02 to 10-08)"),
    "philly-vc": ("philly_vc.csv", "Philly's 11 virtual clusters and their nodes (352 nodes of 8 GPUs): "
                                  "a --cluster or --quota file"),
}


def resolve(ref: str) -> str:
    """``ref`` itself, or the path of the sample ``sample:NAME`` names."""
    if not ref.startswith(PREFIX):
        return ref
    name = ref[len(PREFIX):]
    if name not in SAMPLES:
        raise ValidationError(f"no sample trace {name!r}",
                              hint="the samples: " + ", ".join(f"{PREFIX}{n} ({what})" for n, (_, what) in
                                                               SAMPLES.items()))
    return str(Path(__file__).with_name(SAMPLES[name][0]))
