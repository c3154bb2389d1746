"""Typed `K3_HICACHE_*` settings (read in SGLang's scheduler process by the HiCache plugin).

K3_HICACHE_FAULT: fault injection for the tests' sabotage controls, never for serving.
- `none` (default): nothing is injected.
- `corrupt-restored-kda`: every KDA recurrent state the host tier restores to the device is overwritten with NaN
  after the copy (hooks.corrupt_restored_kda), so a test that compares outputs must see the difference.
K3_HICACHE_EVICTION: how the host tier evicts (hicache/session_eviction.py).
- `lru` (default): SGLang's own eviction (least recently used first) and its default (Rust) TreeCore.
- `sessions` (opt-in until its end-to-end test has passed, docs/sessions.md): whole paused sessions, the most
  recently paused first, after those idle for K3_HICACHE_EVICT_IDLE_S seconds (600; oldest first). `k3 serve` runs
  SGLang's Python TreeCore for it.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from k3_sglang.env_settings import EnvModel


class HiCacheSettings(EnvModel):
    ENV_PREFIX: ClassVar[str] = "K3_HICACHE_"
    fault: Literal["none", "corrupt-restored-kda"] = "none"
    eviction: Literal["sessions", "lru"] = "lru"
    evict_idle_s: float = Field(600.0, ge=0)
