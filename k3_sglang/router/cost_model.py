"""K3 capacity constants and the placement cost formulas. Pure functions, no state.

K3 has two ceilings per worker at once:
- MLA latent KV: 27,648 bytes per token (bf16, all MLA layers); DCP shards it, so a worker's
  KV token capacity is `kv_rows_per_rank * dcp_size`. SGLang 0.5.23 already reports that logical
  figure (`max_total_num_tokens`); only a per-rank figure from a config file needs the product.
- KDA recurrent state: ~449 MB per request per TP group, a fixed-size slot that DCP does not shard.
A resident session holds `context` KV tokens and one state slot.
"""

from __future__ import annotations

import math

MLA_KV_BYTES_PER_TOKEN = 27_648
KDA_STATE_BYTES_PER_SLOT = 449_000_000


def kv_capacity_tokens(kv_tokens_per_rank: int, dcp_size: int = 1) -> int:
    """KV token capacity of a worker from a per-rank figure (as `--max-total-tokens`) times DCP size."""
    return int(kv_tokens_per_rank) * max(1, int(dcp_size))


def state_slots_from_bytes(state_bytes_per_tp_group: float) -> int:
    """KDA state slots that fit a per-TP-group state memory budget (DCP does not change this)."""
    return int(state_bytes_per_tp_group // KDA_STATE_BYTES_PER_SLOT)


def prefill_seconds(tokens: float, prefill_tokens_per_s: float) -> float:
    """Time to prefill `tokens` uncached tokens at a worker's prefill throughput."""
    return max(0.0, tokens) / prefill_tokens_per_s


def predicted_ttft_s(queued_tokens: float, uncached_tokens: float, prefill_tokens_per_s: float) -> float:
    """Predicted time to first token: queued prefill work ahead of us plus our own uncached prefill."""
    return prefill_seconds(queued_tokens + uncached_tokens, prefill_tokens_per_s)


def kv_barrier_s(kv_utilization: float, weight_s: float) -> float:
    """M/M/1-style barrier `weight * k / (1 - k)`: small when KV is free, infinite at capacity."""
    if kv_utilization >= 1.0:
        return math.inf
    k = max(0.0, kv_utilization)
    return weight_s * k / (1.0 - k)


def move_penalty_s(reprefill_tokens: float, prefill_tokens_per_s: float, base_s: float, factor: float) -> float:
    """Hysteresis a follow-up turn must beat to leave its worker: base + factor * re-prefill time."""
    return base_s + factor * prefill_seconds(reprefill_tokens, prefill_tokens_per_s)
