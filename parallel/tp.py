"""Tensor-parallel block layout (pure: no torch.distributed, no SGLang), used by the MLA attention of the k3_cpu_mla
backend for its DCP rank (k3_sglang/dcp_mla/pool_attention.py).

A `Shard` is rank `rank` of `size` equal contiguous blocks of one dimension, the layout of SGLang's column/row-parallel
linears and of its DCP stripes.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size` equal contiguous blocks of one dimension."""

    size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"Shard: rank {self.rank} must be in [0, size={self.size})")

    def part(self, total: int, what: str = "dimension") -> int:
        """The block length; ValueError naming `what` when size does not divide total."""
        if total % self.size:
            raise ValueError(f"{what} ({total}) is not divisible by the parallel size {self.size}")
        return total // self.size

    def bounds(self, total: int, what: str = "dimension") -> tuple[int, int]:
        """[start, stop) of this rank's block of `total`."""
        n = self.part(total, what)
        return self.rank * n, (self.rank + 1) * n
