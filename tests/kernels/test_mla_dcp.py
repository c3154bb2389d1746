"""The k3_dcp_mla kernels (Triton under the interpreter, torch) against `naive.mla_dcp_attention_paged`, and the
contract itself against full attention: merging every rank's (o, lse) gives the single-rank result.

Each case scatters every request's keys over a rank's paged pool in SGLang's DCP layout (position p on rank
p mod c, rank-local key i in row block_table[b, i // P] * P + i % P); every other pool row and every block-table
entry past a request's pages point at NaN rows, and outputs come from NaN-poisoned torch.empty (conftest), so a
kernel that reads a row it should not, or leaves an output unwritten, fails."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.kernels.mla.dcp_layout import block_table_from_req_to_token, local_key_counts, paged_key_rows
from k3_sglang.kernels.mla.dcp_torch import mla_dcp_attention_torch
from k3_sglang.kernels.mla.dcp_triton import mla_dcp_attention_triton, query_blocks
from k3_sglang.kernels.mla.naive import merge_attention_states, mla_dcp_attention_paged, mla_extend_absorbed
from tests.utils.numerics import EXACT_MATH_FP64, FP32_VS_FP64, assert_bit_exact, assert_close

L, C, H, SCALE = 24, 16, 3, 0.41


def rank_batch(keys, c, r, page, gen, spare_pages=3):
    """keys: per request [S_b, L] float64 global rows. Returns (pool [N, L], block_table [B, M] int32, kv_lens [B],
    causal [B]) for rank r of c: the rank's keys in random physical pages, NaN everywhere else."""
    lens = torch.tensor([k.shape[0] for k in keys])
    kv_lens = local_key_counts(lens, c, r)
    pages_per = [(int(n) + page - 1) // page for n in kv_lens]
    width = max(pages_per + [1]) + 1
    total = sum(pages_per) + spare_pages
    pool = torch.full((total * page, L), float("nan"), dtype=torch.float64)
    order = torch.randperm(total, generator=gen)
    nan_page = int(order[-1])  # never used: unused block-table entries point at a NaN page
    block_table = torch.full((len(keys), width), nan_page, dtype=torch.int32)
    used = 0
    for b, k in enumerate(keys):
        mine = k[r::c]
        for j in range(pages_per[b]):
            phys = int(order[used])
            used += 1
            block_table[b, j] = phys
            rows = mine[j * page: (j + 1) * page]
            pool[phys * page: phys * page + rows.shape[0]] = rows
    return pool, block_table, kv_lens, lens


CASES = {  # name: (key lengths per request, queries per request)
    "decode": ([1, 7, 40, 2], [1, 1, 1, 1]),
    "verify": ([9, 30, 4], [3, 3, 3]),
    "chunks": ([70, 5, 33], [21, 5, 1]),
}


def make_case(name, c, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lens, q_lens = CASES[name]
    keys = [torch.randn(n, L, generator=gen, dtype=torch.float64) for n in lens]
    q = torch.randn(sum(q_lens), H, L, generator=gen, dtype=torch.float64)
    q_indptr = torch.tensor([0] + q_lens).cumsum(0)
    return keys, q, q_indptr, gen


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("c,page", [(1, 1), (2, 1), (3, 4), (2, 2)])
def test_torch_path_matches_reference_on_every_rank(name, c, page):
    keys, q, q_indptr, gen = make_case(name, c)
    for r in range(c):
        pool, bt, kv_lens, causal = rank_batch(keys, c, r, page, gen)
        o_ref, lse_ref = mla_dcp_attention_paged(q, pool, bt, q_indptr.tolist(), kv_lens.tolist(), causal.tolist(),
                                                 page, c, r, C, SCALE)
        o, lse = mla_dcp_attention_torch(q, pool, bt, q_indptr, kv_lens, causal, page, c, r, C, SCALE)
        assert_close(f"o rank {r}", o_ref, o, EXACT_MATH_FP64)
        assert_close(f"lse rank {r}", lse_ref, lse, EXACT_MATH_FP64)


@pytest.mark.triton
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("c,page,splits", [(1, 1, 1), (2, 1, 2), (3, 4, None), (2, 2, 1)])
def test_triton_matches_reference_on_every_rank(name, c, page, splits):
    keys, q, q_indptr, gen = make_case(name, c, seed=1)
    q_len = CASES[name][1][0] if len(set(CASES[name][1])) == 1 else None
    for r in range(c):
        pool, bt, kv_lens, causal = rank_batch(keys, c, r, page, gen)
        o_ref, lse_ref = mla_dcp_attention_paged(q, pool, bt, q_indptr.tolist(), kv_lens.tolist(), causal.tolist(),
                                                 page, c, r, C, SCALE)
        o, lse = mla_dcp_attention_triton(q.float(), pool.float(), bt, q_indptr, kv_lens, causal, page, c, r, C,
                                          SCALE, q_len=q_len, num_splits=splits)
        assert o.dtype == torch.float32 and lse.dtype == torch.float32
        assert_close(f"o rank {r}", o_ref, o, FP32_VS_FP64)
        assert_close(f"lse rank {r}", lse_ref, lse, FP32_VS_FP64)  # -inf where a rank sees no key must match


@pytest.mark.parametrize("name", list(CASES))
def test_merging_the_ranks_gives_full_attention(name):
    """The contract is DCP: the LSE merge of the c stripes equals attention over every key (c = 1, dense)."""
    c, page = 3, 2
    keys, q, q_indptr, gen = make_case(name, c, seed=2)
    parts, lses = [], []
    for r in range(c):
        pool, bt, kv_lens, causal = rank_batch(keys, c, r, page, gen)
        o, lse = mla_dcp_attention_paged(q, pool, bt, q_indptr.tolist(), kv_lens.tolist(), causal.tolist(), page, c,
                                         r, C, SCALE)
        parts.append(o)
        lses.append(lse)
    merged, merged_lse = merge_attention_states(torch.stack(parts), torch.stack(lses))
    q_lens = (q_indptr[1:] - q_indptr[:-1]).tolist()
    flat = torch.cat(keys)
    kv_indptr = [0] + torch.tensor([k.shape[0] for k in keys]).cumsum(0).tolist()
    q_start = [k.shape[0] - n for k, n in zip(keys, q_lens)]
    full, full_lse = mla_extend_absorbed(q, flat, torch.arange(flat.shape[0]), q_indptr.tolist(), kv_indptr,
                                         q_start, C, SCALE)
    assert_close("merged o", full, merged, EXACT_MATH_FP64)
    assert_close("merged lse", full_lse, merged_lse, EXACT_MATH_FP64)


def test_block_table_from_sglang_widened_ids():
    """SGLang's allocator: virtual pages of c * P widened ids; rank r's i-th key at physical row v // c."""
    c, page, n = 2, 4, 21
    virtual_pages = [5, 2, 9]  # a request's virtual pages, in position order
    req_to_token = torch.full((3, 32), -1, dtype=torch.int64)
    ids = torch.tensor([vp * c * page + k for vp in virtual_pages for k in range(c * page)])[:n]
    req_to_token[1, :n] = ids
    bt = block_table_from_req_to_token(req_to_token, torch.tensor([1]), 3, page, c)
    for r in range(c):
        kv_lens = local_key_counts(torch.tensor([n]), c, r)
        rows, indptr = paged_key_rows(bt, kv_lens, page)
        want = ids[r::c] // c  # SGLang: position p on rank p mod c at physical row v // c
        assert bool((ids[r::c] % c == r).all())
        assert_bit_exact(f"rows rank {r}", want, rows)
        assert indptr.tolist() == [0, len(want)]


def test_query_blocks_uniform_and_ragged_agree():
    q_indptr = torch.tensor([0, 3, 6, 9])
    ragged = query_blocks(q_indptr, 2, None)
    uniform = query_blocks(q_indptr, 2, 3)
    assert [t.tolist() for t in ragged] == [t.tolist() for t in uniform] == [[0, 0, 1, 1, 2, 2], [0, 2, 3, 5, 6, 8]]
    assert [t.tolist() for t in query_blocks(torch.tensor([0, 5, 5, 6]), 4, None)] == [[0, 0, 2], [0, 4, 5]]


def test_contract_errors_are_clear():
    q, pool = torch.zeros(2, H, L), torch.zeros(8, L)
    bt, lens = torch.zeros(2, 1, dtype=torch.int32), torch.tensor([1, 1])
    with pytest.raises(ValueError, match=r"q_indptr \[B\+1\]"):
        mla_dcp_attention_torch(q, pool, bt, torch.tensor([0, 2]), lens, lens, 1, 1, 0, C, 1.0)
    with pytest.raises(ValueError, match=r"cp_rank 2 in \[0, 2\)"):
        mla_dcp_attention_torch(q, pool, bt, torch.tensor([0, 1, 2]), lens, lens, 1, 2, 2, C, 1.0)
    with pytest.raises(ValueError, match="more queries than its causal length"):
        mla_dcp_attention_torch(q, pool, bt, torch.tensor([0, 2, 2]), lens, lens, 1, 1, 0, C, 1.0)
