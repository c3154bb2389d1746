"""Typed `K3_*` settings for serving (our knobs; SGLang's ServerArgs gets no new flags)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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


@dataclass(frozen=True)
class ServeSettings:
    """K3_MAX_N: most completions one request may ask for; K3_CACHE_DIR: where the tiny checkpoint is built."""

    max_n: int = 16
    cache_dir: Path = Path.home() / ".cache" / "k3-sglang"

    @classmethod
    def from_env(cls) -> "ServeSettings":
        cache = os.environ.get("K3_CACHE_DIR")
        return cls(max_n=_int_env("K3_MAX_N", 16, 1), cache_dir=Path(cache) if cache else cls.cache_dir)
