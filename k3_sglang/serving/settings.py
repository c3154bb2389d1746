"""Typed `K3_*` settings for serving (our knobs; SGLang's ServerArgs gets no new flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# K3_MODEL_IMPL values: which K3 implementation `k3 serve` hands to SGLang (see serving/model_choice.py).
MODEL_IMPLS = ("auto", "portable", "sglang")


def _int_env(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _choice_env(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    if raw not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


@dataclass(frozen=True)
class ServeSettings:
    """K3_MAX_N: most completions one request may ask for; K3_CACHE_DIR: where the tiny checkpoint is built;
    K3_MODEL_IMPL: auto (the portable model on CPU and for the tiny checkpoint, SGLang's own K3 otherwise),
    portable (this repo's model, also on CUDA) or sglang (SGLang's production K3; on CPU through k3_sglang/sglang_cpu)."""

    max_n: int = 16
    cache_dir: Path = Path.home() / ".cache" / "k3-sglang"
    model_impl: str = "auto"

    @classmethod
    def from_env(cls) -> "ServeSettings":
        cache = os.environ.get("K3_CACHE_DIR")
        return cls(max_n=_int_env("K3_MAX_N", 16, 1), cache_dir=Path(cache) if cache else cls.cache_dir,
                   model_impl=_choice_env("K3_MODEL_IMPL", "auto", MODEL_IMPLS))
