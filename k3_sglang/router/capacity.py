"""Worker capacity discovery from SGLang's `/get_server_info` (or `/server_info`) and `/v1/loads`.

Fields read (SGLang 0.5.23):
- `/get_server_info`: `max_total_num_tokens` (per rank KV tokens), `dcp_size`, `max_mamba_cache_size`
  (KDA/linear-attention state slots) else `max_running_requests`, `served_model_name`;
- `/v1/loads` -> `loads[]` per DP rank: `max_total_num_tokens`, `max_running_requests`,
  `num_waiting_uncached_tokens`, `num_running_reqs`, `num_waiting_reqs`, `token_usage`.
A value a worker does not report stays unknown and falls back to the file/flag value, then the
policy default -- never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from k3_sglang.router.config import PolicyConfig, WorkerSpec
from k3_sglang.router.core import Capacity
from k3_sglang.router.cost_model import kv_capacity_tokens


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """The part of `/v1/loads` routing uses, summed over DP ranks (None: not reported)."""

    waiting_uncached_tokens: int | None
    running_requests: int | None
    max_total_num_tokens: int | None
    max_running_requests: int | None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return int(value)


def _sum_field(loads: list, name: str) -> int | None:
    values = [item.get(name) for item in loads if isinstance(item, dict)]
    values = [int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(values) if values else None


def parse_loads(payload: Any) -> ReportedLoad:
    """Parse a `/v1/loads` JSON body (tolerating missing fields)."""
    loads = payload.get("loads") if isinstance(payload, Mapping) else None
    if not isinstance(loads, list):
        return ReportedLoad(None, None, None, None)
    return ReportedLoad(
        _sum_field(loads, "num_waiting_uncached_tokens"),
        _sum_field(loads, "num_running_reqs"),
        _sum_field(loads, "max_total_num_tokens"),
        _sum_field(loads, "max_running_requests"),
    )


def parse_server_info(info: Any) -> dict[str, int | None]:
    """Pick kv_tokens (per rank), dcp_size and state_slots out of a `/get_server_info` body."""
    info = info if isinstance(info, Mapping) else {}
    slots = _positive_int(info.get("max_mamba_cache_size")) or _positive_int(info.get("max_running_requests"))
    return {
        "kv_tokens": _positive_int(info.get("max_total_num_tokens")),
        "dcp_size": _positive_int(info.get("dcp_size")),
        "state_slots": slots,
    }


def resolve_capacity(spec: WorkerSpec, reported: Mapping[str, int | None], cfg: PolicyConfig) -> Capacity:
    """File/flag values win over reported ones, which win over policy defaults."""
    kv_tokens = spec.kv_tokens or reported.get("kv_tokens") or cfg.default_kv_tokens
    dcp = spec.dcp_size or reported.get("dcp_size") or 1
    slots = spec.state_slots or reported.get("state_slots") or cfg.default_state_slots
    tps = spec.prefill_tokens_per_s or cfg.default_prefill_tokens_per_s
    return Capacity(kv_capacity_tokens(kv_tokens, dcp), int(slots), float(tps))


async def _get_json(client: httpx.AsyncClient, url: str, timeout_s: float) -> Any:
    try:
        response = await client.get(url, timeout=timeout_s)
    except (httpx.HTTPError, OSError):
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


async def fetch_reported_capacity(client: httpx.AsyncClient, url: str, timeout_s: float) -> dict[str, int | None]:
    """Ask a worker for its capacities; unknown ones come back as None."""
    info = await _get_json(client, f"{url}/get_server_info", timeout_s)
    if info is None:
        info = await _get_json(client, f"{url}/server_info", timeout_s)
    reported = parse_server_info(info)
    if reported["kv_tokens"] is None or reported["state_slots"] is None:
        loads = parse_loads(await _get_json(client, f"{url}/v1/loads", timeout_s))
        reported["kv_tokens"] = reported["kv_tokens"] or loads.max_total_num_tokens
        reported["state_slots"] = reported["state_slots"] or loads.max_running_requests
    return reported


async def fetch_models(client: httpx.AsyncClient, url: str, timeout_s: float) -> list[dict]:
    """The model cards a worker serves (`/v1/models` data), or [] when it does not answer."""
    payload = await _get_json(client, f"{url}/v1/models", timeout_s)
    data = payload.get("data") if isinstance(payload, Mapping) else None
    return [card for card in data or [] if isinstance(card, dict) and isinstance(card.get("id"), str)]
