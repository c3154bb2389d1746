"""`k3 serve` turns on SGLang's KV-event publisher: the `--kv-events-config` it composes, and the hooks' switch.

SGLang 0.5.23 publishes its radix cache's BlockStored / BlockRemoved / AllBlocksCleared over ZMQ when given
`--kv-events-config` (a JSON `KVEventsConfig`); our plugin adds K3's KDA checkpoint events to the same stream
(`serving/kv_event_hooks.py`) and honours session retention (`serving/retention.py`). Unless the user passes
the flag, or sets `K3_KV_EVENTS=off`, `k3 serve` adds one: a PUB socket bound on loopback (127.0.0.1, or
`K3_KV_EVENTS_HOST`) and a replay socket beside it, on ports free at launch (`dp_size` of each: SGLang offsets
them per DP rank). SGLang advertises both under `kv_events` in `/server_info`, where `k3 router` finds them.
Off loopback (or with `K3_KV_EVENTS_CURVE=on`) both sockets are CURVE-authenticated and encrypted
(serving/kv_events_curve.py): the publisher is then `k3_zmq_curve`, and the key files must be given.
"""

from __future__ import annotations

import json
from collections.abc import Callable
import os
from typing import Literal

from pydantic import model_validator

from k3_sglang.env_settings import EnvModel
from k3_sglang.deployment import Deployment, coerce
from k3_sglang.net import free_port_block

KV_EVENTS_FLAG = "--kv-events-config"
HOOKS_ENV = "K3_SERVE_HOOKS"  # set by `k3 serve`: our SGLang plugins for events and retention are active
TOPIC = "kv"


class KvEventsSettings(EnvModel):
    """K3_KV_EVENTS: on (default) or off; K3_KV_EVENTS_HOST: the address the sockets bind (default 127.0.0.1).
    K3_KV_EVENTS_CURVE: auto (default: on when the host is not loopback), on or off (plain ZMQ even off loopback:
    every prompt goes to whoever connects); with CURVE, K3_KV_EVENTS_CURVE_SECRET_FILE (the worker's ZMQ certificate,
    both keys) and K3_KV_EVENTS_CURVE_CLIENTS_DIR (the admitted clients' public certificates) are required."""

    kv_events: Literal["on", "off"] = "on"
    kv_events_host: str = "127.0.0.1"
    kv_events_curve: Literal["auto", "on", "off"] = "auto"
    kv_events_curve_secret_file: str = ""
    kv_events_curve_clients_dir: str = ""

    @model_validator(mode="after")
    def _curve_keys_given(self):
        if self.enabled and self.curve:
            if not os.path.isfile(self.kv_events_curve_secret_file):
                raise ValueError("K3_KV_EVENTS_CURVE_SECRET_FILE must name the worker's ZMQ certificate file when the "
                                 f"KV events are CURVE-protected (host {self.host!r}, K3_KV_EVENTS_CURVE="
                                 f"{self.kv_events_curve}); got {self.kv_events_curve_secret_file!r}")
            if not os.path.isdir(self.kv_events_curve_clients_dir):
                raise ValueError("K3_KV_EVENTS_CURVE_CLIENTS_DIR must name a directory of the routers' public ZMQ "
                                 f"certificates; got {self.kv_events_curve_clients_dir!r}")
        return self

    @property
    def curve(self) -> bool:
        """Whether the event and replay sockets are CURVE-protected."""
        from k3_sglang.serving.kv_events_curve import is_loopback

        return self.kv_events_curve == "on" or (self.kv_events_curve == "auto" and not is_loopback(self.host))

    @property
    def enabled(self) -> bool:
        return self.kv_events == "on"

    @property
    def host(self) -> str:
        return self.kv_events_host




def kv_events_config(host: str, base_port: int, dp_size: int, publisher: str = "zmq") -> str:
    """The JSON SGLang's `--kv-events-config` takes: PUB on base..base+dp-1, replay on base+dp..base+2dp-1."""
    address = f"[{host}]" if ":" in host else host
    return json.dumps({"publisher": publisher, "endpoint": f"tcp://{address}:{base_port}", "bind": True,
                       "replay_endpoint": f"tcp://{address}:{base_port + dp_size}", "topic": TOPIC})


def kv_events_flags(d: Deployment | list[str], settings: KvEventsSettings,
                    pick_ports: Callable[[int], int] = free_port_block) -> list[str]:
    """The flags `k3 serve` adds: [] when the user configured events or turned them off."""
    d = coerce(d)
    if not settings.enabled or d.sets("kv_events_config"):
        return []
    if d.disaggregation_mode == "decode":
        return []  # a PD decode server keeps no radix cache: nothing to publish
    dp = d.dp
    from k3_sglang.serving.kv_events_curve import PUBLISHER

    publisher = PUBLISHER if settings.curve else "zmq"
    return [KV_EVENTS_FLAG, kv_events_config(settings.host, pick_ports(2 * dp), dp, publisher)]


def hooks_env(env: dict[str, str]) -> dict[str, str]:
    """The server's environment with our event and retention hooks switched on."""
    return {**env, HOOKS_ENV: "1"}
