"""Fakes and helpers for testing Tidal, shipped in the package so that Tidal's own tests, and code tested
against Tidal, share one copy of each.

Importing this package is cheap (the standard library and :mod:`tidal.errors`). It gives the helpers used
everywhere: waiting for a condition (:func:`wait_until`, :func:`wait_for_line`), a clock moved by hand
(:class:`FakeClock`), whether a process lives (:func:`pid_alive`), directories for other accounts
(:func:`shared_dir`, :func:`owned_dir`). What needs more lives in its own module, imported from there:
:mod:`tidal.testing.control` (an in-process control plane and a scripted agent),
:mod:`tidal.testing.server` (an ASGI app behind a real HTTP server),
:mod:`tidal.testing.postgres` (a throw-away PostgreSQL server), :mod:`tidal.testing.seaweedfs` (a throw-away S3
server), :mod:`tidal.testing.hosts` (test hosts: network namespaces on a private bridge, with
:mod:`tidal.testing.relay` for latency and :mod:`tidal.testing.hostsweep` for what killed runs left),
:mod:`tidal.testing.imports` (the modules a program imports)."""

from tidal.testing.clock import FakeClock
from tidal.testing.files import owned_dir, shared_dir
from tidal.testing.processes import pid_alive
from tidal.waiting import WaitTimeout, wait_for_line, wait_until

__all__ = ["FakeClock", "WaitTimeout", "owned_dir", "pid_alive", "shared_dir", "wait_for_line", "wait_until"]
