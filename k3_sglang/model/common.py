"""Small building blocks whose parameter names match the K3 checkpoint (`<name>.weight`)."""

from __future__ import annotations

import torch
from torch import nn

from k3_sglang.kernels.norm.naive import rms_norm


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back, then scaled by `weight` [D]. x [..., D] -> [..., D]."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class WeightOnly(nn.Module):
    """A parameter holder exposing `.weight` (conv kernels, AttnRes projections)."""

    def __init__(self, *shape: int, dtype: torch.dtype | None = None, fill: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full(shape, fill, dtype=dtype), requires_grad=False)


class FusedWeightCache:
    """Concatenation of several weights along dim 0, rebuilt only when one of them changes.

    Keyed on each tensor's storage pointer and in-place version counter, so a weight reload
    (copy_ into the parameter) invalidates it. Used to run several projections as one matmul.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def get(self, weights: list[torch.Tensor]) -> torch.Tensor:
        key = tuple((w.data_ptr(), w._version) for w in weights)
        if key != self._key:
            self._value = torch.cat([w.detach() for w in weights], dim=0)
            self._key = key
        return self._value
