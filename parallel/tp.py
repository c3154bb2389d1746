"""Tensor-parallel layout of the portable K3 model (pure: no torch.distributed, no SGLang).

Every sharded K3 tensor is split into `size` equal contiguous blocks along one dimension, block `rank` on rank
`rank`, the same layout as SGLang's column/row-parallel linears and its K3:
- attention TP: MLA heads (q_b, kv_b, g rows; o_proj columns) and KDA heads (q/k/v/g/f_b rows, b rows, conv
  channels, A_log, dt_bias; o_proj columns); the KDA conv window and recurrent state in SGLang's mamba pool are
  head-sharded the same way ([W-1, 3P/tp], [H/tp, K, V]);
- MoE TP: each routed expert's intermediate (w1/w3 rows, w2 columns) and the dense/shared MLP intermediate;
- MoE EP: whole routed experts, rank r holding experts [r E/ep, (r+1) E/ep).
Replicated: embeddings, norms, AttnRes weights, MLA q_a/kv_a, KDA f_a, the router, the latent down/up
projections and the LM head.
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


def tp_constraint_errors(cfg, attn_tp: int, moe_tp: int, moe_ep: int, dcp: int) -> list[str]:
    """Every way (attn_tp, moe_tp, moe_ep, dcp) does not fit config `cfg` (a K3Config), as messages naming the
    constraint; empty when the layout is valid."""
    errors = []

    def need(total: int, size: int, what: str, flag: str) -> None:
        if size > 1 and total % size:
            errors.append(f"{flag} {size} does not divide {what} ({total})")

    need(cfg.mla.num_heads, attn_tp, "the MLA head count", "--tp-size")
    need(cfg.kda.num_heads, attn_tp, "the KDA head count", "--tp-size")
    need(cfg.moe.dense_intermediate_size, moe_tp * moe_ep, "the dense MLP intermediate size", "--tp-size")
    need(cfg.moe.shared_intermediate_size, moe_tp * moe_ep, "the shared-expert intermediate size", "--tp-size")
    need(cfg.moe.moe_intermediate_size, moe_tp, "the routed-expert intermediate size", "MoE TP size")
    need(cfg.moe.num_experts, moe_ep, "the routed expert count", "--ep-size")
    if dcp > 1 and attn_tp % dcp:
        errors.append(f"--dcp-size {dcp} must divide the attention TP size ({attn_tp})")
    return errors
