"""Fakes and helpers for testing Tidal, shipped in the package so that Tidal's own tests, and code tested
against Tidal, share one copy of each.

Importing this package is cheap (the standard library, :mod:`tidal.errors`): it gives the helpers used
everywhere. What needs more lives in its own module, imported from there:
:mod:`tidal.testing.control` (an in-process control plane and a scripted agent),
:mod:`tidal.testing.server` (an ASGI app behind a real HTTP server),
:mod:`tidal.testing.postgres` (a throw-away PostgreSQL server)."""

from tidal.testing.clock import FakeClock
from tidal.testing.waiting import WaitTimeout, wait_for_line, wait_until

__all__ = ["FakeClock", "WaitTimeout", "wait_for_line", "wait_until"]
