"""``tidal events -f``: the event log followed as it grows, over the control plane's event stream
(``GET /v1/events/stream``), until interrupted; with ``--job J``, until the job ends, exiting with its exit
status as ``tidal wait`` does. A lost connection (a restart of the control plane) is taken up again where it
left off (the stream resumes after the last event's ``seq``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import yaml

from tidal.cli import listings
from tidal.cli.api import Client
from tidal.cli.formats import Format, _one_line
from tidal.cli.logs import TERMINAL, exit_status
from tidal.control.client import ControlPlaneError

#: Waits between attempts to take a lost stream up again, and how long to keep trying.
RETRY_S = (0.5, 1.0, 2.0, 5.0)
GIVE_UP_S = 120.0


def printer(fmt: Format, with_job: bool) -> Callable[[dict[str, Any]], None]:
    """How each event is printed as it comes: a line of the events listing's columns (no alignment across
    lines: they come one by one), a JSON object per line (``-o json``), or a YAML document (``-o yaml``)."""
    if fmt is Format.json:
        return lambda e: print(json.dumps(e, separators=(",", ":")), flush=True)
    if fmt is Format.yaml:
        return lambda e: print("---\n" + yaml.safe_dump(e, sort_keys=False, allow_unicode=True), end="", flush=True)
    cols = [c for c in listings.EVENTS.columns
            if (fmt is Format.wide or not c.wide) and (with_job or c.header != "JOB")]
    return lambda e: print("  ".join(_one_line(c.value(e)) for c in cols).rstrip(), flush=True)


def follow(api: Client, job: str | None, last: int, fmt: Format) -> int | None:
    """Print the last ``last`` events, then each new one. ``job``: that job's only, until it ends; its exit
    status then. Without ``job``, it runs until interrupted."""
    show = printer(fmt, with_job=job is None)
    params: dict[str, Any] = {"job": job, "last": last} if job else {"last": last}
    rows = api.get("/v1/events", params=params)
    for e in rows:
        show(e)
    # From the last event printed; with none, from the start of what this user may see (there is none yet).
    after = int(rows[-1]["seq"]) if rows else 0
    if job is not None:
        j = api.get(f"/v1/jobs/{job}")
        if j["state"] in TERMINAL:
            return exit_status(j)
    lost_at: float | None = None
    tries = 0
    while True:
        try:
            for e in api.stream("/v1/events/stream", after=after, job=job):
                lost_at, tries = None, 0
                show(e)
                after = int(e["seq"])
                if job is not None and e.get("kind") in TERMINAL:
                    return exit_status(api.get(f"/v1/jobs/{job}"))
        except ControlPlaneError:
            lost_at = lost_at or time.monotonic()
            if time.monotonic() - lost_at > GIVE_UP_S:
                raise
        # The server closed the stream, or the connection was lost: take it up again after the last seen.
        time.sleep(RETRY_S[min(tries, len(RETRY_S) - 1)])
        tries += 1
