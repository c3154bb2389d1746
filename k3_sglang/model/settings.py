"""Typed `K3_*` settings the model reads in SGLang's worker processes (parsed once per process).

K3_MLA_EXTEND: how MLA prefill chunks attend.
- `chunk` (default): the chunk's queries over the request's cached pool rows (`model/mla_attention.py`),
  O(chunk x prefix) per chunk.
- `torch_native`: SGLang's torch_native extend, which recomputes attention over prefix + chunk for every chunk
  (O(prefix^2) per chunk); kept only as the baseline for `k3 bench long-context`.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

MLA_EXTEND_PATHS = ("chunk", "torch_native")


@dataclass(frozen=True)
class ModelSettings:
    mla_extend: str = "chunk"

    def __post_init__(self) -> None:
        if self.mla_extend not in MLA_EXTEND_PATHS:
            raise ValueError(f"K3_MLA_EXTEND must be one of {', '.join(MLA_EXTEND_PATHS)}, got {self.mla_extend!r}")

    @classmethod
    def from_env(cls) -> "ModelSettings":
        return cls(mla_extend=os.environ.get("K3_MLA_EXTEND", "") or "chunk")


@functools.lru_cache(maxsize=1)
def model_settings() -> ModelSettings:
    """The process's settings (the environment SGLang's workers inherit from `k3 serve`)."""
    return ModelSettings.from_env()
