"""Where one forward's queries and this DCP rank's keys are: the arguments of the k3_dcp_mla kernel
(`dispatch.mla_dcp`), read from SGLang's ForwardBatch and request-to-token map.

- decode: one query per request at global position seq_len - 1; keys from the pool, this rank's stripe;
- target verify: the verified tokens per request (dense draft width, or K3_CSV's ragged `verify_lens`), the last at
  global position seq_len + n - 1; keys from the pool (the chain's rows are written first);
- extend (a prefill chunk): the chunk's queries at positions prefix .. prefix + n - 1. Without SGLang's gathered
  buffer the keys are this rank's stripe of the pool (the `k3_cpu_mla` backend then merges the ranks' partials); with it
  (SGLang's K3 under DCP all-gathers the prefix and the chunk into `attn_dcp_metadata.dcp_kv_buffer`) every key of
  the request is in that buffer in position order and the chunk attends them all as one dense rank (c = 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from k3_sglang.kernels.mla.dcp_layout import block_table_from_req_to_token, local_key_counts


@dataclass(frozen=True)
class StripeBatch:
    """The kernel's view of one forward: block_table [B, M] int32 physical pages, q_indptr [B+1], kv_lens [B]
    rank-local key counts, causal_seqs [B] global position of each request's last query + 1; page_size, cp_world,
    cp_rank of the layout; q_len when every request holds q_len queries; gathered: keys are SGLang's all-gathered
    extend buffer (not the pool)."""

    block_table: torch.Tensor
    q_indptr: torch.Tensor
    kv_lens: torch.Tensor
    causal_seqs: torch.Tensor
    page_size: int
    cp_world: int
    cp_rank: int
    q_len: int | None
    gathered: bool = False


def _ptr(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, 0, out=out[1:])
    return out


def _longest(lens: torch.Tensor) -> int:
    """The longest of lens [B], read from the device tensor itself (a host sync), never from SGLang's host copy:
    under CUDA-graph capture seq_lens_cpu holds a fill value and a table sized from it would stay that short at every
    replay, so capture is refused explicitly (k3_dcp_mla runs eagerly)."""
    if lens.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("k3_dcp_mla: MLA attention cannot run under CUDA-graph capture (its block table is sized "
                           "from the live seq_lens); serve with --cuda-graph-backend-decode disabled")
    return int(lens.max()) if lens.numel() else 0


def verify_lengths(forward_batch) -> tuple[torch.Tensor, int | None]:
    """(queries per request [B] on the device, q_len when every request has as many) of a TARGET_VERIFY forward."""
    spec = forward_batch.spec_info
    ragged = getattr(spec, "verify_lens", None)  # K3_CSV: per-request chain lengths (spec/info.py)
    layout = getattr(spec, "ragged_verify_layout", None)  # SGLang's ragged verify layout (DSpark and K3_CSV)
    if ragged is None and layout is not None:
        ragged = layout.verify_lens_cpu
    seq = forward_batch.seq_lens
    if ragged is not None:
        ragged = [int(n) for n in ragged]
        lens = torch.tensor(ragged, dtype=seq.dtype, device=seq.device)
        return lens, (ragged[0] if len(set(ragged)) == 1 else None)
    n = int(spec.draft_token_num)
    return torch.full_like(seq, n), n


def stripe_batch(forward_batch, req_to_token: torch.Tensor, page_size: int, cp_world: int,
                 cp_rank: int) -> StripeBatch:
    """The StripeBatch of a DECODE, TARGET_VERIFY or EXTEND forward (see the module docstring)."""
    mode = forward_batch.forward_mode
    seq = forward_batch.seq_lens
    if mode.is_decode():
        b = seq.shape[0]
        q_indptr = torch.arange(b + 1, dtype=torch.int32, device=seq.device)
        causal, q_len = seq, 1
    elif mode.is_target_verify():
        n, q_len = verify_lengths(forward_batch)
        q_indptr, causal = _ptr(n), seq + n
    else:
        q_indptr, causal, q_len = _ptr(forward_batch.extend_seq_lens), seq, None
        dcp_meta = getattr(forward_batch, "attn_dcp_metadata", None)
        if cp_world > 1 and dcp_meta is not None and dcp_meta.dcp_kv_buffer is not None:
            return _gathered_extend(dcp_meta, seq, q_indptr, _longest(seq))
    longest = _longest(causal)
    kv_lens = local_key_counts(causal, cp_world, cp_rank)
    local_longest = (longest - cp_rank + cp_world - 1) // cp_world if longest > cp_rank else 0
    num_blocks = max(1, (local_longest + page_size - 1) // page_size)
    table = block_table_from_req_to_token(req_to_token, forward_batch.req_pool_indices, num_blocks, page_size, cp_world)
    return StripeBatch(table, q_indptr, kv_lens.to(torch.int32), causal.to(torch.int32), page_size, cp_world, cp_rank,
                       q_len)


def _gathered_extend(dcp_meta, seq: torch.Tensor, q_indptr: torch.Tensor, longest: int) -> StripeBatch:
    """Keys in SGLang's gathered buffer: request b's keys are rows dcp_kv_indices[indptr[b]:indptr[b+1]] in position
    order, laid out as a page-1 block table [B, longest]."""
    valid = torch.arange(longest, device=seq.device)[None, :] < seq[:, None].long()
    table = torch.zeros(seq.shape[0], longest, dtype=torch.int32, device=seq.device)
    table[valid] = dcp_meta.dcp_kv_indices.to(torch.int32)  # seq_lens_sum entries, request after request
    return StripeBatch(table, q_indptr, seq.to(torch.int32), seq.to(torch.int32), 1, 1, 0, None, gathered=True)
