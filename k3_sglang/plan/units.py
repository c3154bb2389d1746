"""Byte units and the small formatting helpers the planner's reports share."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def to_gib(nbytes: float) -> float:
    """Bytes as binary gigabytes (GiB), the unit SGLang's logs call "GB"."""
    return nbytes / GIB


def from_gib(gib: float) -> int:
    """GiB as whole bytes."""
    return int(gib * GIB)


def human_tokens(tokens: int) -> str:
    """1,234,567 -> '1.23M'; 45,678 -> '45.7K'; small counts unchanged."""
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.2f}M"
    if tokens >= 10_000:
        return f"{tokens / 1_000:.1f}K"
    return str(tokens)
