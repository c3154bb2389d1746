"""Typed `K3_*` settings of the `k3 serve` process (our knobs; SGLang's ServerArgs gets no new flags)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from k3_sglang.env_settings import EnvModel


class ServeSettings(EnvModel):
    """K3_MAX_N: most samples (`n`, `best_of`, `beam_width`) one prompt may ask for; K3_MAX_SEQUENCES: most
    sequences (prompts x samples) one request may start (serving/guards.py); K3_CACHE_DIR: where the tiny checkpoint is built."""

    max_n: int = Field(16, ge=1)
    max_sequences: int = Field(256, ge=1)
    cache_dir: Path = Path.home() / ".cache" / "k3-sglang"
