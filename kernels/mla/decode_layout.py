"""The (kv_indices, kv_indptr) layout of a decode batch, from SGLang's request-to-token map.

Sized by the device-side seq_lens themselves, never by a host-side copy: during CUDA-graph capture SGLang's
seq_lens_cpu holds a fill value, and a gather sized from it would stay that short at every replay. Reading the real
maximum is a host sync, which CUDA-graph capture forbids, so capture is refused here explicitly (the portable model
runs decode eagerly; `k3 serve` refuses CUDA graphs for it).
"""
from __future__ import annotations

import torch


def decode_kv_layout(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """req_to_token [R, max_ctx] pool row of each position of each request slot, req_pool_indices [B] request
    slots, seq_lens [B] positions each request attends (the new token included).

    Returns (kv_indices [sum(seq_lens)] int64 pool rows, request after request; kv_indptr [B+1] int64), the layout
    `dispatch.mla_decode` reads. Raises RuntimeError under CUDA-graph capture, ValueError for a length beyond
    req_to_token's width.
    """
    if seq_lens.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("MLA decode: the portable K3 model cannot run under CUDA-graph capture (its gather is "
                           "sized from the live seq_lens); serve it with --cuda-graph-backend-decode disabled")
    if seq_lens.dim() != 1 or tuple(req_pool_indices.shape) != tuple(seq_lens.shape) or req_to_token.dim() != 2:
        raise ValueError(f"decode_kv_layout: seq_lens {tuple(seq_lens.shape)} and req_pool_indices "
                         f"{tuple(req_pool_indices.shape)} must be [B], req_to_token {tuple(req_to_token.shape)} [R, C]")
    lens = seq_lens.long()
    kv_indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.long, device=lens.device)
    torch.cumsum(lens, 0, out=kv_indptr[1:])
    longest = int(lens.max()) if lens.numel() else 0
    if longest > req_to_token.shape[1]:
        raise ValueError(f"decode_kv_layout: a request attends {longest} positions, req_to_token holds "
                         f"{req_to_token.shape[1]}")
    table = req_to_token[req_pool_indices.long(), :longest]  # [B, S]
    valid = torch.arange(longest, device=lens.device)[None, :] < lens[:, None]
    return table[valid].long(), kv_indptr
