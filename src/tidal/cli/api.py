"""The CLI's handle on the control plane: its HTTP client, :class:`tidal.control.client.Client`, made with
the URL, token and trust that the flags, the environment and the config file give (:mod:`tidal.cli.config`)."""

from __future__ import annotations

from tidal.cli.config import connection
from tidal.control.client import Client


def Api(who: str = "user") -> Client:
    """A client of the control plane, as ``who`` (``admin`` for the admin's commands)."""
    return connection.client(who)


__all__ = ["Api", "Client"]
