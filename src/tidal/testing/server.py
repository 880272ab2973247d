"""An ASGI app behind a real HTTP server, for tests of what only a real server does (body limits on the
wire, streaming)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tidal.waiting import wait_until


@contextmanager
def served(app: Any, *, timeout: float = 10.0) -> Iterator[str]:
    """``app`` served by uvicorn on a free loopback port, in a thread, until the block ends; its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Open streams (the event stream) get a second at the end, as the control plane's own server gives them.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout=timeout, what=f"the HTTP server on port {port} to start",
                   interval=0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
