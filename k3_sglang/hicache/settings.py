"""Typed `K3_HICACHE_*` settings (read in SGLang's scheduler process by the HiCache plugin).

K3_HICACHE_FAULT: fault injection for the tests' sabotage controls, never for serving.
- `none` (default): nothing is injected.
- `corrupt-restored-kda`: every KDA recurrent state the host tier restores to the device is overwritten with NaN
  after the copy (hooks.corrupt_restored_kda), so a test that compares outputs must see the difference.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from k3_sglang.env_settings import EnvModel


class HiCacheSettings(EnvModel):
    ENV_PREFIX: ClassVar[str] = "K3_HICACHE_"
    fault: Literal["none", "corrupt-restored-kda"] = "none"
