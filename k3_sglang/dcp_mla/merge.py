"""The DCP steps around the kernel that the `k3_cpu_mla` backend runs itself (pool_attention.py; the k3_dcp_mla
backend leaves them to SGLang's K3's `forward_mla`): all-gather the group's query heads, attend this rank's keys (`dispatch.mla_dcp`), and merge the
ranks' partials with SGLang's own exact LSE merges over SGLang's DCP group (on the k3_cpu platform their Triton
kernels and collectives take the torch paths of cpu_kernels.py, installed by the plugins).
"""
from __future__ import annotations

import torch

from k3_sglang.dcp_mla.metadata import StripeBatch
from k3_sglang.kernels import dispatch

MERGE_BACKENDS = ("ag_rs", "a2a")


def dcp_group():
    """SGLang's DCP GroupCoordinator in this worker."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().dcp_group


def gather_heads(q_lat: torch.Tensor, group) -> torch.Tensor:
    """[T, H_l, L] on each rank of the DCP group -> [T, c H_l, L], head blocks in DCP-rank order."""
    return group.all_gather(q_lat.contiguous(), dim=1)


def attend(q_lat: torch.Tensor, cache: torch.Tensor, batch: StripeBatch, v_dim: int,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q_lat [T, H, L], cache [N, L] this rank's pool rows -> (o [T, H, v_dim], lse [T, H] natural log)."""
    return dispatch.mla_dcp(q_lat.to(cache.dtype), cache, batch.block_table, batch.q_indptr, batch.kv_lens,
                            batch.causal_seqs, batch.page_size, batch.cp_world, batch.cp_rank, v_dim, scale,
                            q_len=batch.q_len)


def merge_heads(o: torch.Tensor, lse: torch.Tensor, group, backend: str) -> torch.Tensor:
    """o [T, c H_l, C], lse [T, c H_l] (natural log) this rank's partials -> [T, H_l, C] merged, this rank's heads:
    SGLang's `cp_lse_ag_out_rs_mla` (ag_rs) or `dcp_a2a_lse_reduce` (a2a)."""
    from sglang.srt.layers.dcp import cp_lse_ag_out_rs_mla, dcp_a2a_lse_reduce

    if backend == "a2a":
        return dcp_a2a_lse_reduce(o.contiguous(), lse.float().contiguous(), group, is_lse_base_on_e=True)
    if backend == "ag_rs":
        return cp_lse_ag_out_rs_mla(o, lse.float(), group, is_lse_base_on_e=True).transpose(0, 1)
    raise ValueError(f"unknown DCP merge backend {backend!r}; supported: {', '.join(MERGE_BACKENDS)}")
