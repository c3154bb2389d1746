"""Where a DCP rank's keys are: stripe lengths, paged block tables and their flat row lists (tensor ops, no loops).

SGLang's DCP layout (within a group of c ranks, pages of P tokens per rank): the allocator hands out widened ids v
with virtual pages of c * P; position p of a request lives on rank p mod c, at physical row v // c. A virtual page
covers positions [j c P, (j + 1) c P) and maps, on every rank, to physical page v // (c P) of that rank's pool, whose
P rows hold the rank's positions of that virtual page in order. So rank r's i-th key of a request (global position
r + c i) is row block_table[b, i // P] * P + i % P, with the same block table on every rank. c = 1 is the dense
single-rank layout.
"""
from __future__ import annotations

import torch


def local_key_counts(seq_lens: torch.Tensor, cp_world: int, cp_rank: int) -> torch.Tensor:
    """seq_lens [B] global lengths -> [B] how many of positions 0..L-1 are congruent to cp_rank mod cp_world."""
    if not 0 <= cp_rank < cp_world:
        raise ValueError(f"local_key_counts: cp_rank {cp_rank} must be in [0, cp_world={cp_world})")
    return torch.clamp((seq_lens - cp_rank + cp_world - 1) // cp_world, min=0)


def block_table_from_req_to_token(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, num_blocks: int,
                                  page_size: int, cp_world: int) -> torch.Tensor:
    """req_to_token [R, max_ctx] widened ids per position, req_pool_indices [B] -> block_table [B, num_blocks] int32.

    Entry j is the physical page (of every rank in the group) holding the rank-local keys j P .. (j + 1) P - 1; read
    from the first position of virtual page j. Entries past a request's length are whatever req_to_token holds there
    (the kernels never read them)."""
    span = page_size * cp_world
    firsts = req_to_token[req_pool_indices.long(), : num_blocks * span: span]  # [B, <= num_blocks] (row width)
    return (firsts // span).to(torch.int32)


def paged_key_rows(block_table: torch.Tensor, kv_lens: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """block_table [B, M], kv_lens [B] rank-local key counts -> (kv_indices [sum(kv_lens)] int64 cache rows, request
    after request; kv_indptr [B+1] int64)."""
    lens = kv_lens.long()
    kv_indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.long, device=lens.device)
    torch.cumsum(lens, 0, out=kv_indptr[1:])
    total = int(kv_indptr[-1])
    if total == 0:
        return kv_indptr.new_zeros(0), kv_indptr
    req = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens)
    i = torch.arange(total, device=lens.device) - kv_indptr[:-1][req]
    pages = block_table.long()[req, i // page_size]
    return pages * page_size + i % page_size, kv_indptr
