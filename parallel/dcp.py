"""Decode-context parallelism for MLA: the stripe layout and the exact merge of partial attentions.

Layout (SGLang's): within a DCP group of c ranks, token position p of every request lives on rank p mod c, at
physical pool row v // c of its widened (virtual) id v. Rank r's i-th key of a request therefore sits at
position r + c * i, and a request of L tokens has `local_key_count(L, c, r)` keys there.

Attention: every rank of the group takes the queries of all c * H_l heads of the group (its own H_l heads plus
the other ranks', all-gathered), attends its own stripe, and returns (o [T, c H_l, C], lse [T, c H_l]). The exact
result for a head is sum_r exp(lse_r - LSE) o_r with LSE = logsumexp_r lse_r; each rank keeps its own H_l heads:
- `merge_ag_rs`: all-gather the LSEs, weight the partials locally, reduce-scatter the weighted outputs by head
  block (moves c x [T, H_l, C] partials plus the LSEs);
- `merge_a2a`: all-to-all of (o, lse) by head block, then each rank merges the c partials of its own heads.
A rank with no visible key gives lse = -inf and weight 0 (never NaN).
"""
from __future__ import annotations

from typing import Protocol

import torch

MERGE_BACKENDS = ("ag_rs", "a2a")


class Collective(Protocol):
    """The three collectives the merge needs, over the c ranks of one DCP group (see parallel/groups.py)."""

    size: int
    rank: int

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [...] on every rank -> [c, ...] (rank order)."""

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """x [c, ...] on every rank -> sum over ranks of x[self.rank] [...]."""

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """x [c, ...] (block j for rank j) -> [c, ...] (block j from rank j)."""


def local_key_count(seq_len: int, c: int, r: int) -> int:
    """How many of positions 0..seq_len-1 are congruent to r mod c (rank r's keys of a seq_len-token request)."""
    return 0 if seq_len <= r else (seq_len - 1 - r) // c + 1


def merge_weights(lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """lses [c, ...] partial LSEs (natural log; -inf: empty) -> (weights exp(lse_r - LSE) [c, ...], LSE [...]).

    An entry empty on every rank gets weights 0 and LSE -inf."""
    lse = torch.logsumexp(lses, 0)
    empty = torch.isneginf(lse)
    w = torch.where(torch.isneginf(lses), 0.0, (lses - torch.where(empty, 0.0, lse)).exp())
    return w, lse


def _blocks(x: torch.Tensor, c: int) -> torch.Tensor:
    """[T, c * H_l, ...] -> [c, T, H_l, ...] contiguous (head block j first for rank j)."""
    t, heads = x.shape[0], x.shape[1]
    if heads % c:
        raise ValueError(f"DCP merge: {heads} heads do not split into {c} rank blocks")
    return x.reshape(t, c, heads // c, *x.shape[2:]).transpose(0, 1).contiguous()


def merge_ag_rs(o: torch.Tensor, lse: torch.Tensor, group: Collective) -> torch.Tensor:
    """o [T, c H_l, C], lse [T, c H_l] this rank's partials over its stripe -> merged o [T, H_l, C] of its heads."""
    w, _ = merge_weights(group.all_gather(lse.float()))  # [c, T, c H_l]
    weighted = o.float() * w[group.rank][..., None]
    return group.reduce_scatter(_blocks(weighted, group.size)).to(o.dtype)


def merge_a2a(o: torch.Tensor, lse: torch.Tensor, group: Collective) -> torch.Tensor:
    """Same result as merge_ag_rs, by one all-to-all of (o, lse) per head block."""
    packed = torch.cat([o.float(), lse.float()[..., None]], -1)  # [T, c H_l, C + 1]
    recv = group.all_to_all(_blocks(packed, group.size))  # [c, T, H_l, C + 1]: rank j's partial of my heads
    w, _ = merge_weights(recv[..., -1])
    merged = torch.where(w[..., None] > 0, w[..., None] * recv[..., :-1], 0.0).sum(0)
    return merged.to(o.dtype)


def merge(o: torch.Tensor, lse: torch.Tensor, group: Collective, backend: str) -> torch.Tensor:
    if backend == "a2a":
        return merge_a2a(o, lse, group)
    if backend == "ag_rs":
        return merge_ag_rs(o, lse, group)
    raise ValueError(f"unknown DCP merge backend {backend!r}; supported: {', '.join(MERGE_BACKENDS)}")
