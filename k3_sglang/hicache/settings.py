"""Typed `K3_HICACHE_*` settings (read in SGLang's scheduler process by the HiCache plugin).

K3_HICACHE_FAULT: fault injection for the tests' sabotage controls, never for serving.
- `none` (default): nothing is injected.
- `corrupt-restored-kda`: every KDA recurrent state the host tier restores to the device is overwritten with NaN
  after the copy (hooks.corrupt_restored_kda), so a test that compares outputs must see the difference.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

FAULTS = ("none", "corrupt-restored-kda")


@dataclass(frozen=True)
class HiCacheSettings:
    fault: str = "none"

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"K3_HICACHE_FAULT must be one of {', '.join(FAULTS)}, got {self.fault!r}")

    @classmethod
    def from_env(cls) -> "HiCacheSettings":
        return cls(fault=os.environ.get("K3_HICACHE_FAULT", "").strip() or "none")
