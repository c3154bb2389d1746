"""Worker capacity and load discovery from SGLang's `/get_server_info` (or `/server_info`) and `/v1/loads`.

Fields read (SGLang 0.5.23):
- `/get_server_info`: `max_total_num_tokens` (KV tokens, already *logical*: rows per rank x DCP),
  `dcp_size`, `max_mamba_cache_size` (KDA/linear-attention state slots) else `max_running_requests`;
  and for PD: `disaggregation_mode`, `disaggregation_bootstrap_port`, `page_size`, `kv_cache_dtype`,
  `dtype`, `disaggregation_transfer_backend`;
- `/v1/loads` -> `loads[]` per DP rank: `max_total_num_tokens` (logical), `max_running_requests`,
  `num_waiting_uncached_tokens`, `num_waiting_reqs`, `num_running_reqs`.
So a reported KV capacity is used as is; only a config-file `kv_tokens` (per rank, as SGLang's
`--max-total-tokens`) is multiplied by `dcp_size`. A value a worker does not report stays unknown
and falls back to the file/flag value, then the policy default -- never zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from k3_sglang.router.config import DECODE, PREFILL, PolicyConfig, WorkerSpec
from k3_sglang.router.core import Capacity
from k3_sglang.router.cost_model import kv_capacity_tokens
from k3_sglang.router.pd import KVLayout, layout_from_server_info, reported_bootstrap_port, reported_role

CONTROL_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """The part of `/v1/loads` routing uses, summed over DP ranks (None: not reported)."""

    waiting_uncached_tokens: int | None
    waiting_requests: int | None
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
        return ReportedLoad(None, None, None, None, None)
    return ReportedLoad(*(_sum_field(loads, name) for name in (
        "num_waiting_uncached_tokens", "num_waiting_reqs", "num_running_reqs", "max_total_num_tokens",
        "max_running_requests")))


def parse_server_info(info: Any) -> dict[str, int | None]:
    """Pick kv_tokens (logical), dcp_size and state_slots out of a `/get_server_info` body."""
    info = info if isinstance(info, Mapping) else {}
    slots = _positive_int(info.get("max_mamba_cache_size")) or _positive_int(info.get("max_running_requests"))
    return {
        "kv_tokens": _positive_int(info.get("max_total_num_tokens")),
        "dcp_size": _positive_int(info.get("dcp_size")),
        "state_slots": slots,
    }


def resolve_capacity(spec: WorkerSpec, reported: Mapping[str, int | None], cfg: PolicyConfig) -> Capacity:
    """File/flag values win over reported ones, which win over policy defaults."""
    if spec.kv_tokens:
        kv_tokens = kv_capacity_tokens(spec.kv_tokens, spec.dcp_size or reported.get("dcp_size") or 1)
    else:
        kv_tokens = reported.get("kv_tokens") or cfg.default_kv_tokens
    slots = spec.state_slots or reported.get("state_slots") or cfg.default_state_slots
    tps = spec.prefill_tokens_per_s or cfg.default_prefill_tokens_per_s
    return Capacity(int(kv_tokens), int(slots), float(tps))


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, Any]:
    """(status, parsed JSON or None) of a GET; status 0 when the worker cannot be reached."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            body = await response.read()
            if response.status != 200:
                return response.status, None
            try:
                return 200, orjson.loads(body)
            except orjson.JSONDecodeError:
                return 200, None
    except CONTROL_ERRORS:
        return 0, None


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a worker says about itself: capacities (None: unknown), and its PD role, bootstrap port and KV layout."""

    capacity: dict[str, int | None]
    role: str | None = None
    bootstrap_port: int | None = None
    layout: KVLayout | None = None


async def fetch_worker_report(session: aiohttp.ClientSession, url: str, timeout_s: float) -> WorkerReport:
    """Ask a worker for its capacities and PD facts.

    A PD server's running-request cap (`/v1/loads` `max_running_requests`) is its state-slot ceiling:
    a decode server runs without a radix cache, one KDA slot per request, up to that cap; a prefill
    server's cap is its mamba pool divided by SGLang's slots per request."""
    _, info = await get_json(session, f"{url}/get_server_info", timeout_s)
    if info is None:
        _, info = await get_json(session, f"{url}/server_info", timeout_s)
    reported = parse_server_info(info)
    role = reported_role(info)
    if reported["kv_tokens"] is None or reported["state_slots"] is None or role in (PREFILL, DECODE):
        loads = parse_loads((await get_json(session, f"{url}/v1/loads", timeout_s))[1])
        reported["kv_tokens"] = reported["kv_tokens"] or loads.max_total_num_tokens
        slots = [v for v in (reported["state_slots"], loads.max_running_requests) if v]
        reported["state_slots"] = (min(slots) if role in (PREFILL, DECODE) else slots[0]) if slots else None
    return WorkerReport(reported, role, reported_bootstrap_port(info), layout_from_server_info(info))


async def fetch_reported_capacity(session: aiohttp.ClientSession, url: str, timeout_s: float) -> dict[str, int | None]:
    """Ask a worker for its capacities; unknown ones come back as None."""
    return (await fetch_worker_report(session, url, timeout_s)).capacity


async def fetch_models(session: aiohttp.ClientSession, url: str, timeout_s: float) -> list[dict]:
    """The model cards a worker serves (`/v1/models` data), or [] when it does not answer."""
    _, payload = await get_json(session, f"{url}/v1/models", timeout_s)
    data = payload.get("data") if isinstance(payload, Mapping) else None
    return [card for card in data or [] if isinstance(card, dict) and isinstance(card.get("id"), str)]
