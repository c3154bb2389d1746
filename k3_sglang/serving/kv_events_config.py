"""`k3 serve` turns on SGLang's KV-event publisher: the `--kv-events-config` it composes, and the hooks' switch.

SGLang 0.5.23 publishes its radix cache's BlockStored / BlockRemoved / AllBlocksCleared over ZMQ when given
`--kv-events-config` (a JSON `KVEventsConfig`); our plugin adds K3's KDA checkpoint events to the same stream
(`serving/kv_event_hooks.py`) and honours session retention (`serving/retention.py`). Unless the user passes
the flag, or sets `K3_KV_EVENTS=off`, `k3 serve` adds one: a PUB socket bound on loopback (127.0.0.1, or
`K3_KV_EVENTS_HOST`) and a replay socket beside it, on ports free at launch (`dp_size` of each: SGLang offsets
them per DP rank). SGLang advertises both under `kv_events` in `/server_info`, where `k3 router` finds them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Literal

from k3_sglang.env_settings import EnvModel
from k3_sglang.serving.argv import flag_value as _flag_value
from k3_sglang.net import free_port_block

KV_EVENTS_FLAG = "--kv-events-config"
HOOKS_ENV = "K3_SERVE_HOOKS"  # set by `k3 serve`: our SGLang plugins for events and retention are active
TOPIC = "kv"


class KvEventsSettings(EnvModel):
    """K3_KV_EVENTS: on (default) or off; K3_KV_EVENTS_HOST: the address the sockets bind (default 127.0.0.1)."""

    kv_events: Literal["on", "off"] = "on"
    kv_events_host: str = "127.0.0.1"

    @property
    def enabled(self) -> bool:
        return self.kv_events == "on"

    @property
    def host(self) -> str:
        return self.kv_events_host




def kv_events_config(host: str, base_port: int, dp_size: int) -> str:
    """The JSON SGLang's `--kv-events-config` takes: PUB on base..base+dp-1, replay on base+dp..base+2dp-1."""
    address = f"[{host}]" if ":" in host else host
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://{address}:{base_port}", "bind": True,
                       "replay_endpoint": f"tcp://{address}:{base_port + dp_size}", "topic": TOPIC})


def kv_events_flags(extra: list[str], settings: KvEventsSettings,
                    pick_ports: Callable[[int], int] = free_port_block) -> list[str]:
    """The flags `k3 serve` adds: [] when the user configured events or turned them off."""
    if not settings.enabled or any(a == KV_EVENTS_FLAG or a.startswith(KV_EVENTS_FLAG + "=") for a in extra):
        return []
    if _flag_value(extra, "--disaggregation-mode", "null") == "decode":
        return []  # a PD decode server keeps no radix cache: nothing to publish
    dp = max(1, int(_flag_value(extra, "--dp-size", _flag_value(extra, "--dp", "1"))))
    return [KV_EVENTS_FLAG, kv_events_config(settings.host, pick_ports(2 * dp), dp)]


def hooks_env(env: dict[str, str]) -> dict[str, str]:
    """The server's environment with our event and retention hooks switched on."""
    return {**env, HOOKS_ENV: "1"}
