"""Small network helpers shared by the serving and router code.

Ports we pick for servers come from below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`,
32768-60999 on Linux by default): a port handed out by `bind(0)` sits inside that range, where any outgoing
connection (an HTTP client, gloo, ZMQ) may take it as its source port before our server binds it, and a server that
binds late (SGLang's scheduler binds its KV-event sockets after the model loads) loses that race often enough to
fail a test run. Below the range only another listener can take the port, and each pick is checked by binding it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 20000  # above the well-known and most registered service ports


def ephemeral_range(path: Path = _PORT_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (low, high); Linux's default when the file is absent or unreadable."""
    try:
        low, high = (int(v) for v in path.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidate_ports(count: int) -> range:
    """Ports a block of `count` may start at: below the ephemeral range when it leaves room, else above it."""
    low, high = ephemeral_range()
    if low - _LOWEST >= 1000 + count:
        return range(_LOWEST, low - count)
    return range(high + 1, 65536 - count)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(attempts: int = 200) -> int:
    """A TCP port free on 127.0.0.1 now, outside the kernel's ephemeral range (see the module docstring)."""
    return free_port_block(1, attempts)


def free_port_block(count: int, attempts: int = 200) -> int:
    """First of `count` consecutive TCP ports free on 127.0.0.1 now, outside the ephemeral range (for launchers
    that count up)."""
    rng = random.Random()
    candidates = _candidate_ports(count)
    for _ in range(attempts):
        base = rng.choice(candidates)
        if all(_bindable(port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 after {attempts} tries")
