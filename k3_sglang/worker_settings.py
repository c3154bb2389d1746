"""Typed `K3_*` settings of SGLang's server processes (parsed once per process).

- K3_KV_READ_TRACE: folder for the per-rank MLA pool-read trace (`dcp_mla/kv_read_trace.py`, `k3 bench dcp`).
- K3_SPEC_*: the K3_CSV section `spec` (`spec/settings.py`).
`k3 serve` parses the same model once before it starts SGLang, so a bad value exits 2 there.
"""
from __future__ import annotations

import functools
from pathlib import Path

from k3_sglang.env_settings import EnvModel
from k3_sglang.spec.settings import SpecSettings


class WorkerSettings(EnvModel):
    kv_read_trace: Path | None = None
    spec: SpecSettings = SpecSettings()


@functools.lru_cache(maxsize=1)
def worker_settings() -> WorkerSettings:
    """The process's settings (the environment SGLang's workers inherit from `k3 serve`)."""
    return WorkerSettings.from_env()
