"""Small network helpers shared by the serving and router code."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
