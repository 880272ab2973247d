"""Numbers as a person reads them: durations (``1.08 s``, ``3m 12s``), sizes (``4.0 GiB``), moments
(``3m 12s ago``, ``14:02:11``). Only tables and messages use these; ``-o json|yaml`` keep the raw numbers
(seconds, bytes, Unix times). And durations as a person gives them (``30s``, ``5m``, ``1h``)."""

from __future__ import annotations

import re
import time
from datetime import datetime

from tidal.errors import ValidationError, shown

__all__ = ["ago", "clock", "duration", "parse_duration", "rate", "size"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, field: str = "checkpoint_every") -> float:
    """Seconds, from ``30``, ``30s``, ``5m``, ``1h`` or ``2d``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValidationError(f"{field}: bad duration {shown(text)}", field=field, hint="e.g. 30s, 5m, 1h")
    return float(m.group(1)) * _UNITS[m.group(2)]



def size(n: int | float | None) -> str:
    """``512 B``, ``1.5 KiB``, ``4.0 GiB``: :func:`tidal.core.units.size`, as the control plane's event details
    say them. Imported on first use: importing tidal.core makes its whole model, which `tidal ls` can do without."""
    from tidal.core.units import size

    return size(n)

def duration(seconds: float | None) -> str:
    """``350 ms``, ``1.08 s``, ``12.3 s``, ``3m 12s``, ``2h 05m``, ``3d 4h``; ``-`` for none."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    return _coarse(s)


def _coarse(s: float) -> str:
    """Two units, the larger first: ``3m 12s``, ``2h 05m``, ``3d 4h``."""
    n = int(s)
    if n < 3600:
        return f"{n // 60}m {n % 60:02d}s"
    if n < 86400:
        return f"{n // 3600}h {n % 3600 // 60:02d}m"
    return f"{n // 86400}d {n % 86400 // 3600}h"


def ago(t: float | None, now: float | None = None) -> str:
    """How long before ``now`` the Unix time ``t`` was: ``5s ago``, ``3m 12s ago``, ``2h 05m ago``; or, a
    minute or more ahead of it (an expiry), how long until: ``in 23h 59m``; ``-`` for none."""
    if t is None:
        return "-"
    delta = (time.time() if now is None else now) - t
    if delta <= -60:
        return "in " + _coarse(-delta)
    delta = max(0.0, delta)
    return (f"{int(delta)}s" if delta < 60 else _coarse(delta)) + " ago"


def clock(t: float | None) -> str:
    """The local time of day of ``t``, with its date when it is not today: ``14:02:11``,
    ``2024-05-01 14:02:11``; ``-`` for none."""
    if t is None:
        return "-"
    moment = datetime.fromtimestamp(t)
    if moment.date() == datetime.now().date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def rate(per_s: float) -> str:
    """A rate per second: ``2.45/s``, ``310/s``."""
    return f"{per_s:.2f}/s" if per_s < 100 else f"{per_s:.0f}/s"
