"""The CLI's handle on the control plane: its HTTP client, :class:`tidal.control.client.Client`, under the
name the job commands use."""

from __future__ import annotations

from tidal.control.client import Client as Api

__all__ = ["Api"]
