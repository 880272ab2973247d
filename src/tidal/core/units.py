"""Sizes as a person reads them (``512 B``, ``4.0 GiB``): in the CLI's tables and in the event details the
control plane writes. Raw numbers stay in the API's fields and in ``-o json``."""

from __future__ import annotations

_SIZES = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size(n: int | float | None) -> str:
    """``512 B``, ``1.5 KiB``, ``4.0 GiB`` (powers of 1024); ``-`` for none."""
    if n is None:
        return "-"
    value = float(n)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in _SIZES[:-1]:
        value /= 1024
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} {_SIZES[-1]}"
