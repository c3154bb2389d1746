"""Small network helpers shared by the serving and router code."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_block(count: int, attempts: int = 50) -> int:
    """First of `count` consecutive TCP ports currently free on 127.0.0.1 (for launchers that count up)."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 after {attempts} tries")
