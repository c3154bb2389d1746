"""The drafter contract of K3_CSV: what a drafter proposes each decode step and what it is told after a verify.

Pure python + numpy (no torch, no sglang): the worker converts a `DraftBlock` into tensors itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class DraftRequest:
    """One running request as the drafter sees it.

    prompt: prompt token ids, stable for the request's life.
    output: committed output token ids so far; output[-1] is the ROOT (the last committed token, whose KV is not
        written yet); drafts continue after it. May be empty only before the first decode step.
    """

    rid: str
    prompt: Sequence[int]
    output: Sequence[int]


@dataclass(frozen=True)
class DraftBlock:
    """The drafts of one step for N requests, G = gamma columns.

    tokens: [N, G] int64 draft tokens following each root (padding 0).
    conf: [N, G] float64 in [0, 1]: conditional acceptance P(draft j accepted | drafts < j accepted); 0 for padding.
    n_drafted: [N] int64 valid drafts per request (cells >= n_drafted are padding).
    """

    tokens: np.ndarray
    conf: np.ndarray
    n_drafted: np.ndarray

    def __post_init__(self) -> None:
        if self.tokens.ndim != 2 or self.conf.shape != self.tokens.shape:
            raise ValueError(f"DraftBlock: tokens {self.tokens.shape} and conf {self.conf.shape} must be equal [N, G]")
        if self.n_drafted.shape != (self.tokens.shape[0],):
            raise ValueError(f"DraftBlock: n_drafted {self.n_drafted.shape} must be [N={self.tokens.shape[0]}]")

    @property
    def num_requests(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def gamma(self) -> int:
        return int(self.tokens.shape[1])

    def survival(self) -> np.ndarray:
        """[N, G] float64 cumprod(conf) along G: P(drafts 0..j all accepted); 0 at padding. Monotone non-increasing."""
        valid = np.arange(self.gamma)[None, :] < self.n_drafted[:, None]
        return np.cumprod(np.where(valid, np.clip(self.conf, 0.0, 1.0), 0.0), axis=1)

    @classmethod
    def empty(cls, num_requests: int, gamma: int) -> "DraftBlock":
        """A block with no drafts: tokens/conf [N, G] zeros, n_drafted [N] zeros."""
        return cls(
            tokens=np.zeros((num_requests, gamma), dtype=np.int64),
            conf=np.zeros((num_requests, gamma), dtype=np.float64),
            n_drafted=np.zeros(num_requests, dtype=np.int64),
        )


@runtime_checkable
class Drafter(Protocol):
    """What the K3_CSV worker calls: propose every decode step, observe after a verify, release at the end."""

    def propose(self, requests: Sequence[DraftRequest], gamma: int) -> DraftBlock:
        """Drafts for every request (row b = requests[b]), at most gamma each."""
        ...

    def observe(self, rid: str, n_verified: int, n_accepted: int) -> None:
        """n_verified drafts of the last proposal for rid were verified (root excluded); the first n_accepted
        (0 <= n_accepted <= n_verified) were accepted. Not called for a step that ran as plain decode."""
        ...

    def release(self, rid: str) -> None:
        """The request finished or aborted: drop its state (unknown rid is a no-op)."""
        ...


def check_observation(n_verified: int, n_accepted: int, n_drafted: int) -> None:
    """Clear ValueError for an observation that cannot describe the last proposal."""
    if not 0 <= n_accepted <= n_verified <= n_drafted:
        raise ValueError(
            f"observe: need 0 <= n_accepted ({n_accepted}) <= n_verified ({n_verified}) <= n_drafted ({n_drafted})"
        )


def check_gamma(gamma: int) -> None:
    if int(gamma) < 1:
        raise ValueError(f"propose: gamma must be >= 1, got {gamma}")
