"""The `k3` radix-cache backend: SGLang's UnifiedRadixCache with K3's session features, through SGLang's public
`register_radix_cache_backend` (selected by `--radix-cache-backend k3`, which `k3 serve` passes: serving/cli.py).

SGLang's `create_unified_radix_cache(ctx, cache_class=...)` builds the cache it always builds for K3 (FULL + MAMBA
components, HiCache attached as configured), only of our subclass. Earlier these features were process-wide
HookRegistry hooks on UnifiedRadixCache, MambaComponent and UnifiedTreeCore, which touched every cache of every
model SGLang served in the process; now only a server that selects the backend has them. The overrides call the
feature functions with SGLang's method as `original`, in the hook conventions (BEFORE, AFTER, AROUND):

- KDA checkpoint events (serving/kv_event_hooks.py): `insert`, `_apply_cache_action` (a MAMBA device slot freed),
  `take_events`, `reset`;
- the host tier's checkpoint events (serving/kv_event_tiers.py): `_execute_kv_backup`, `_drain_host_frees` (MAMBA host
  slots freed), `load_back`;
- session retention (serving/retention.py): `checkpoint_into_tree`, `_evict`, `reset`;
- the host tier's session eviction (hicache/session_eviction_hooks.py; K3_HICACHE_EVICTION=sessions with HiCache):
  `match_prefix` samples the access clock, and the cache's TreeCore is `K3SessionTreeCore` (SGLang's Python
  TreeCore with `drive_host_eviction` by session), registered through SGLang's public `register_tree_core_backend`
  and picked for this cache alone through `CacheInitParams.tree_core_backend`.
Each feature stays inert where it was: events only when the cache publishes them and keeps KDA states, retention
only for a request that asked for it.
"""
from __future__ import annotations

import logging

from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from k3_sglang.hicache import session_eviction_hooks as sessions
from k3_sglang.serving import kv_event_hooks as events
from k3_sglang.serving import kv_event_tiers as tiers
from k3_sglang.serving import retention

log = logging.getLogger(__name__)

BACKEND = "k3"  # --radix-cache-backend
SESSION_TREE_CORE = "k3_sessions"  # CacheInitParams.tree_core_backend under K3_HICACHE_EVICTION=sessions
_BASE = UnifiedRadixCache


class K3RadixCache(UnifiedRadixCache):
    """SGLang's unified radix cache with KDA checkpoint events (device and host tier), session retention and, when
    `k3_session_eviction`, the access clock of the host tier's session eviction."""

    k3_session_eviction = False  # set on the instance by `create` (K3_HICACHE_EVICTION=sessions with HiCache)

    def insert(self, params, *args, **kwargs):
        return events.insert_with_checkpoint_event(_BASE.insert, self, params, *args, **kwargs)

    def _apply_cache_action(self, action, *args, **kwargs):
        events.note_freed_checkpoints(self, action)
        return _BASE._apply_cache_action(self, action, *args, **kwargs)

    def take_events(self, *args, **kwargs):
        return events.take_events_with_checkpoints(_BASE.take_events, self, *args, **kwargs)

    def reset(self, *args, **kwargs):
        result = _BASE.reset(self, *args, **kwargs)
        events.forget_checkpoints_on_reset(result, self)
        retention.forget_on_reset(result, self)
        return result

    def _execute_kv_backup(self, node_id, device_value, comp_xfers, *args, **kwargs):
        return tiers.backup_with_checkpoint_event(_BASE._execute_kv_backup, self, node_id, device_value, comp_xfers,
                                                  *args, **kwargs)

    def _drain_host_frees(self, host_frees, *args, **kwargs):
        tiers.note_freed_host_checkpoints(self, host_frees)
        return _BASE._drain_host_frees(self, host_frees, *args, **kwargs)

    def load_back(self, node_id, *args, **kwargs):
        return tiers.load_back_with_checkpoint_event(_BASE.load_back, self, node_id, *args, **kwargs)

    def checkpoint_into_tree(self, req, *args, **kwargs):
        result = _BASE.checkpoint_into_tree(self, req, *args, **kwargs)
        retention.retain_finished_turn(result, self, req)
        return result

    def _evict(self, *args, **kwargs):
        retention.release_expired(self)
        return _BASE._evict(self, *args, **kwargs)

    def match_prefix(self, params, *args, **kwargs):
        if self.k3_session_eviction:
            sessions.sample_clock(self, params)
        return _BASE.match_prefix(self, params, *args, **kwargs)


class K3SessionTreeCore(UnifiedTreeCore):
    """SGLang's Python TreeCore whose host-tier eviction frees whole paused sessions first
    (hicache/session_eviction_hooks.evict_host_by_session), SGLang's own pass for the remainder."""

    def drive_host_eviction(self, component_type, num_tokens, *args, **kwargs):
        return sessions.evict_host_by_session(UnifiedTreeCore.drive_host_eviction, self, component_type, num_tokens,
                                              *args, **kwargs)


def overridden() -> list[str]:
    """Dotted paths of the SGLang methods K3RadixCache and K3SessionTreeCore override (each has an OVERRIDE row in
    k3_sglang/sglang_reaches.py, where its fingerprint is watched)."""
    return [f"{base.__module__}.{base.__qualname__}.{name}"
            for base, cls in ((UnifiedRadixCache, K3RadixCache), (UnifiedTreeCore, K3SessionTreeCore))
            for name, value in vars(cls).items() if callable(value) and not name.startswith("__")]


def session_eviction_on(ctx) -> bool:
    """K3_HICACHE_EVICTION=sessions on a cache with HiCache (the only tier it evicts)."""
    from k3_sglang.hicache.settings import HiCacheSettings

    return bool(ctx.enable_hierarchical_cache) and HiCacheSettings.from_env().eviction == "sessions"


def create(ctx):
    """SGLang's RadixCacheFactory for `--radix-cache-backend k3`: the unified radix cache SGLang builds by default
    for K3, of class K3RadixCache (with the session TreeCore under session eviction)."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    on = session_eviction_on(ctx)
    if on:
        ctx.params.tree_core_backend = SESSION_TREE_CORE
    cache = create_unified_radix_cache(ctx, cache_class=K3RadixCache)
    cache.k3_session_eviction = on
    log.info("radix cache backend %s: %s%s", BACKEND, type(cache).__name__,
             ", host-tier session eviction" if on else "")
    return cache


def _session_tree_core(params, components):
    return K3SessionTreeCore(params, components)


def register() -> None:
    """Register the `k3` radix-cache backend and the `k3_sessions` TreeCore with SGLang (once per process)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend
    from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
        get_tree_core_factory,
        register_tree_core_backend,
    )

    if get_radix_cache_factory(BACKEND) is None:
        register_radix_cache_backend(BACKEND, create)
    if get_tree_core_factory(SESSION_TREE_CORE) is None:
        register_tree_core_backend(SESSION_TREE_CORE, _session_tree_core)
