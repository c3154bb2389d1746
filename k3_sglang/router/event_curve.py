"""ZMQ CURVE keys for KV events that leave a host (the worker side is serving/kv_events_curve.py). Pure but zmq.

A worker that publishes with CURVE advertises the publisher `k3_zmq_curve` in `/server_info`; the router subscribes
to it only when given its own certificate and the worker's public one (`--curve-key`,
`--curve-server-key`; ZMQ certificate files as `zmq.auth.create_certificates` writes), and its SUB and replay
DEALER sockets are then CURVE clients. Without them such a worker is placed by text inference (logged once).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CURVE_PUBLISHER = "k3_zmq_curve"


@dataclass(frozen=True)
class CurveKeys:
    """A ZMQ CURVE key pair (Z85 bytes); `secret` is None for a public-only certificate."""

    public: bytes
    secret: bytes | None


def load_keys(path: str, what: str) -> CurveKeys:
    """Read a ZMQ certificate file (ValueError naming `what` when it cannot)."""
    import zmq.auth

    if not path or not os.path.isfile(path):
        raise ValueError(f"{what}: no certificate file at {path!r}")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: {path} is not a ZMQ certificate: {exc}") from None
    return CurveKeys(public, secret)


def client_socket_options(client: CurveKeys, server_public: bytes) -> list[tuple[int, bytes]]:
    """The ZMQ options that make a SUB / DEALER socket a CURVE client of a worker with `server_public`."""
    import zmq

    if client.secret is None:
        raise ValueError("the router's CURVE certificate holds no secret key")
    return [(zmq.CURVE_SERVERKEY, server_public), (zmq.CURVE_PUBLICKEY, client.public),
            (zmq.CURVE_SECRETKEY, client.secret)]
