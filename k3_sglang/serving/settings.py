"""Typed `K3_*` settings of the `k3 serve` process (our knobs; SGLang's ServerArgs gets no new flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from k3_sglang.env_settings import EnvModel

# K3_MODEL_IMPL values: which K3 implementation `k3 serve` hands to SGLang (see serving/model_choice.py).
ModelImpl = Literal["auto", "portable", "sglang"]


class ServeSettings(EnvModel):
    """K3_MAX_N: most samples (`n`, `best_of`, `beam_width`) one prompt may ask for; K3_MAX_SEQUENCES: most
    sequences (prompts x samples) one request may start (serving/guards.py); K3_CACHE_DIR: where the tiny checkpoint is built; K3_MODEL_IMPL: auto (the portable model on CPU and for the
    tiny checkpoint, SGLang's own K3 otherwise), portable (this repo's model, also on CUDA) or sglang (SGLang's
    production K3; on CPU through k3_sglang/sglang_cpu)."""

    max_n: int = Field(16, ge=1)
    max_sequences: int = Field(256, ge=1)
    cache_dir: Path = Path.home() / ".cache" / "k3-sglang"
    model_impl: ModelImpl = "auto"
