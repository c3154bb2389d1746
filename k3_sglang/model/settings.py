"""Typed `K3_*` settings of SGLang's server processes that run the portable model (parsed once per process).

- K3_MLA_EXTEND: how MLA prefill chunks attend. `chunk` (default): the chunk's queries over the request's cached
  pool rows (`model/mla_attention.py`), O(chunk x prefix) per chunk. `torch_native`: SGLang's torch_native extend,
  which recomputes attention over prefix + chunk for every chunk (O(prefix^2) per chunk); kept only as the baseline
  for `k3 bench long-context`.
- K3_KV_READ_TRACE: folder for the per-rank MLA pool-read trace (`model/kv_read_trace.py`, `k3 bench dcp`).
- K3_STAGE_TRACE: folder for the per-stage forward spans (`parallel/pipeline_trace.py`, `k3 bench pp-prefill`).
- K3_SPEC_*: the K3_CSV section `spec` (`spec/settings.py`).
`k3 serve` parses the same model once before it starts SGLang, so a bad value exits 2 there.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from k3_sglang.env_settings import EnvModel
from k3_sglang.spec.settings import SpecSettings

MLAExtendPath = Literal["chunk", "torch_native"]


class WorkerSettings(EnvModel):
    mla_extend: MLAExtendPath = "chunk"
    kv_read_trace: Path | None = None
    stage_trace: Path | None = None
    spec: SpecSettings = SpecSettings()


@functools.lru_cache(maxsize=1)
def worker_settings() -> WorkerSettings:
    """The process's settings (the environment SGLang's workers inherit from `k3 serve`)."""
    return WorkerSettings.from_env()
