"""The node's own credential, as its agent gets and keeps it.

A new node's agent is given a join token (``tidal agent --join-token``, made by an admin with ``tidal token
create --node NODE``). It exchanges it once for the node's own credential (``POST /v1/agent/join``) and keeps
that owner-only in its node root (``ROOT/agent.token``), using it from then on, across restarts: the join
token is used up. ``tidal up`` gives its agents the cluster credential in a file instead (``--token-file``)."""

from __future__ import annotations

import ssl
from pathlib import Path

from tidal.agent.client import ControlClient
from tidal.core import protocol
from tidal.mechanisms.permissions import write_private

FILE = "agent.token"


def path(root: Path) -> Path:
    return root / FILE


def stored(root: Path) -> str | None:
    """The credential this node's agent got before, or None."""
    try:
        token = path(root).read_text().strip()
    except FileNotFoundError:
        return None
    return token or None


def store(root: Path, token: str) -> Path:
    """Keep the credential where only root (the agent's account) may read it; atomically."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    p = path(root)
    write_private(p, (token + "\n").encode())
    return p


def join(url: str, join_token: str, node: str, verify: ssl.SSLContext | bool) -> str:
    """Exchange the join token for the node's own credential. A refusal (unknown, used, expired or revoked
    join token, or one for another node) raises :class:`tidal.agent.client.Refused` with the control
    plane's message; a control plane that is down is waited for."""
    client = ControlClient(url, join_token, node, verify)
    try:
        answer = client.send("/v1/agent/join", protocol.Join(name=node))
    finally:
        client.http.close()
    return str(answer["token"])
