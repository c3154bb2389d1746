"""The host-tier session eviction policy (hicache/session_eviction.py) at work in the `k3` radix cache
(serving/radix_cache.py) when `K3_HICACHE_EVICTION=sessions` (opt-in) and HiCache is on:

1. `K3RadixCache.match_prefix` samples the access clock (SGLang's logical counter, the request's tokenizer creation
   time) before SGLang's match.
2. `K3SessionTreeCore.drive_host_eviction` (SGLang's Python TreeCore): evict host leaves by `victim_rank`, whole
   sessions first; SGLang's own pass frees whatever remains short of the request.
"""

from __future__ import annotations

import importlib
import logging

from k3_sglang.hicache.session_eviction import (
    COUNTER_MODULE,
    COUNTER_NAME,
    AccessClock,
    drive_session_eviction,
    victim_rank,
)

log = logging.getLogger(__name__)
CLOCK = AccessClock()
_SETTINGS = []  # HiCacheSettings, parsed once per process
STATS = {"calls": 0, "leaves": 0, "fallback_calls": 0}


def _counter() -> float:
    return float(getattr(importlib.import_module(COUNTER_MODULE), COUNTER_NAME))


def sample_clock(cache, params, *args, **kwargs):
    """(1) before SGLang's match_prefix: the counter now, at the creation time of the request being matched."""
    req = getattr(params, "req", None)
    stats = getattr(req, "time_stats", None)
    created = float(getattr(stats, "created_time", 0.0) or 0.0)
    if created > 0:
        CLOCK.sample(_counter(), created)
    return None


def _merge(into, other) -> None:
    """Move a DriveHostEvictionResult's frees, counts and actions into another (the donor ends empty)."""
    for name in ("device_frees", "host_frees"):
        mine, theirs = getattr(into, name), getattr(other, name)
        for ct, values in list(theirs.items()):
            mine[ct].extend(values)
        theirs.clear()
    for ct, n in other.tracker.items():
        into.tracker[ct] += n
    into.cache_actions.extend(other.cache_actions)
    other.cache_actions.clear()


def evict_host_by_session(original, core, component_type, num_tokens, *args, **kwargs):
    """(2) around SGLang's drive_host_eviction: free `num_tokens` of `component_type` from the host tier, whole
    paused sessions in `victim_rank` order (hicache/session_eviction.py), then SGLang's own pass for any remainder."""
    from k3_sglang.hicache.settings import HiCacheSettings

    if core.is_write_back or core.enable_session_radix_cache or not core.evictable_host_leaves:
        return original(core, component_type, num_tokens, *args, **kwargs)
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import DriveHostEvictionResult

    if not _SETTINGS:
        _SETTINGS.append(HiCacheSettings.from_env())
    horizon = _SETTINGS[0].evict_idle_s
    result = DriveHostEvictionResult()
    leaves = sorted(core.evictable_host_leaves, key=lambda n: (n.last_access_time, n.id))

    def evict(node):
        core._evict_host_leaf(node, result.tracker, result.device_frees, result.host_frees,
                              cache_actions=result.cache_actions)

    STATS["calls"] += 1
    STATS["leaves"] += drive_session_eviction(
        leaves,
        rank=lambda n: victim_rank(n.last_access_time, CLOCK.idle_s(n.last_access_time), horizon),
        is_leaf=lambda n: n in core.evictable_host_leaves,
        parent=lambda n: n.parent,
        evict=evict,
        done=lambda: result.tracker[component_type] >= num_tokens)
    remaining = num_tokens - result.tracker[component_type]
    if remaining > 0:
        STATS["fallback_calls"] += 1
        _merge(result, original(core, component_type, remaining, *args, **kwargs))
    return result
