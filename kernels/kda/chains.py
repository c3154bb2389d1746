"""Packed speculative chains as dense rows: the layout the CPU KDA verify (k3_sglang/sglang_cpu/kda_ops.py) reads."""
from __future__ import annotations

import torch


def chain_layout(query_start_loc: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed chains (request b owns rows qsl[b]:qsl[b+1] of num_tokens, lengths equal or ragged) ->
    (dense index [B, L] int64: the packed row of token t of request b, num_tokens where t is past its chain, L the
    longest chain; packed index [T] int64: each packed row's cell in a flattened [B, L]), on qsl's device."""
    starts = query_start_loc.long().cpu()
    lens = starts[1:] - starts[:-1]
    L = int(lens.max()) if lens.numel() else 0
    steps = torch.arange(L)[None, :]
    valid = steps < lens[:, None]
    index = torch.where(valid, starts[:-1, None] + steps, torch.full_like(steps, num_tokens))
    return index.to(query_start_loc.device), valid.flatten().nonzero().flatten().to(query_start_loc.device)
