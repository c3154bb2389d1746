"""The k3_dcp_mla backend's forward paths as SGLang's K3 calls them (q_nope / q_rope / k_nope / k_rope), one rank at a
time over a pool in SGLang's DCP layout (widened ids, owner-filtered writes, physical row v // c), against the float64
full attention: decode and target verify return rank-local (o, base-2 LSE) whose merge over the ranks is exact;
an extend over SGLang's gathered buffer attends every key with the rank's own heads. Pool rows nobody writes are NaN."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from k3_sglang.dcp_mla import backend as backend_module
from k3_sglang.kernels.mla.naive import merge_attention_states, mla_extend_absorbed
from tests.utils.numerics import FP32_VS_FP64, assert_close

H, C, R, PAGE = 4, 16, 8, 2
L, SCALE = C + R, 0.3


class FakeMLAPool:
    """SGLang's MLA pool as one DCP rank sees it: writes at widened ids, kept by the owner (v % c == rank) at v // c."""

    def __init__(self, rows: int, c: int, rank: int):
        self.buffer = torch.full((rows, 1, L), float("nan"))
        self.c, self.rank, self.page_size = c, rank, PAGE

    def set_mla_kv_buffer(self, layer, loc, k_nope, k_rope):
        loc = getattr(loc, "loc", loc)
        mine = loc % self.c == self.rank
        self.buffer[loc[mine] // self.c] = torch.cat([k_nope, k_rope], -1)[mine].to(self.buffer.dtype)

    def get_key_buffer(self, layer_id):
        return self.buffer


def _layout(seq_lens: list[int], c: int, gen):
    """req_to_token [B, 64] widened ids: virtual pages of c * PAGE ids, scattered."""
    span = c * PAGE
    pages_needed = [-(-n // span) for n in seq_lens]
    order = torch.randperm(sum(pages_needed) + 2, generator=gen) + 1  # page 0 stays unused
    req_to_token, used = torch.zeros(len(seq_lens), 64, dtype=torch.int64), 0
    for b, need in enumerate(pages_needed):
        for j in range(need):
            req_to_token[b, j * span:(j + 1) * span] = order[used] * span + torch.arange(span)
            used += 1
    return req_to_token, (int(order.max()) + 1) * PAGE


def _mode(name: str):
    return SimpleNamespace(is_idle=lambda: False, is_decode=lambda: name == "decode",
                           is_target_verify=lambda: name == "verify", is_extend=lambda: name != "decode")


def _runner(pool, req_to_token):
    return SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                           token_to_kv_pool=pool, kv_index_translator=SimpleNamespace(is_translating=False),
                           page_size=PAGE)


def _run_rank(monkeypatch, mode: str, c: int, rank: int, keys, q, seq_lens, q_lens, req_to_token, rows):
    """Committed keys written, then the forward's own rows through the backend; returns its output."""
    monkeypatch.setattr(backend_module, "_dcp_rank", lambda: (c, rank))
    monkeypatch.setattr(backend_module, "merge_lse_base_e", lambda: False)
    pool = FakeMLAPool(rows, c, rank)
    committed = [n - k for n, k in zip(seq_lens, q_lens)]
    for b, n in enumerate(committed):  # earlier steps' rows
        pool.set_mla_kv_buffer(None, req_to_token[b, :n], keys[b][:n, None, :C], keys[b][:n, None, C:])
    out_loc = torch.cat([req_to_token[b, n: n + k] for b, (n, k) in enumerate(zip(committed, q_lens))])
    new_rows = torch.cat([keys[b][n: n + k] for b, (n, k) in enumerate(zip(committed, q_lens))]).float()
    batch = SimpleNamespace(forward_mode=_mode(mode), req_pool_indices=torch.arange(len(seq_lens)),
                            out_cache_loc=out_loc, out_cache_loc_is_physical=False, attn_dcp_metadata=None,
                            seq_lens=torch.tensor(committed if mode == "verify" else seq_lens),
                            spec_info=SimpleNamespace(draft_token_num=q_lens[0]),
                            extend_seq_lens=torch.tensor(q_lens))
    be = backend_module.K3DcpMLABackend(_runner(pool, req_to_token))
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=H, head_dim=L, v_head_dim=C, scaling=SCALE)
    be.init_forward_metadata(batch)
    fwd = be.forward_decode if mode == "decode" else be.forward_extend
    return fwd(q[..., :C].reshape(q.shape[0], -1).float(), new_rows[:, None, :C], None, layer, batch,
               q_rope=q[..., C:].float(), k_rope=new_rows[:, None, C:])


def _full(keys, q, seq_lens, q_lens):
    flat = torch.cat(keys)
    kv_ptr = [0, *torch.tensor(seq_lens).cumsum(0).tolist()]
    q_ptr = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    return mla_extend_absorbed(q, flat, torch.arange(flat.shape[0]), q_ptr, kv_ptr,
                               [n - k for n, k in zip(seq_lens, q_lens)], C, SCALE)


@pytest.mark.parametrize("mode,q_lens", [("decode", [1, 1, 1]), ("verify", [3, 3, 3])])
@pytest.mark.parametrize("c", [2, 3])
def test_rank_local_outputs_merge_to_full_attention(monkeypatch, mode, q_lens, c):
    gen = torch.Generator().manual_seed(c)
    seq_lens = [1 + q_lens[0] - 1, 9, 14]  # the first request: ranks above 0 hold none of its committed keys
    keys = [torch.randn(n, L, generator=gen, dtype=torch.float64) for n in seq_lens]
    q = torch.randn(sum(q_lens), H, L, generator=gen, dtype=torch.float64)
    req_to_token, rows = _layout(seq_lens, c, gen)
    parts, lses = [], []
    for rank in range(c):
        o, lse2 = _run_rank(monkeypatch, mode, c, rank, keys, q, seq_lens, q_lens, req_to_token, rows)
        assert o.shape == (q.shape[0], H * C) and lse2.shape == (q.shape[0], H)
        parts.append(o.view(-1, H, C))
        lses.append(lse2 * math.log(2.0))  # the backend hands SGLang's merge a base-2 LSE
    merged, merged_lse = merge_attention_states(torch.stack(parts).double(), torch.stack(lses).double())
    want, want_lse = _full(keys, q, seq_lens, q_lens)
    assert_close("merged o", want, merged, FP32_VS_FP64)
    assert_close("merged lse", want_lse, merged_lse, FP32_VS_FP64)


def test_extend_over_the_gathered_buffer_attends_every_key(monkeypatch):
    """Under DCP SGLang's K3 gathers prefix + chunk into attn_dcp_metadata.dcp_kv_buffer (request after request,
    position order); the chunk attends it with the rank's own heads, no merge."""
    c, rank = 2, 1
    gen = torch.Generator().manual_seed(5)
    seq_lens, q_lens = [6, 11], [2, 5]
    keys = [torch.randn(n, L, generator=gen, dtype=torch.float64) for n in seq_lens]
    q = torch.randn(sum(q_lens), H, L, generator=gen, dtype=torch.float64)
    monkeypatch.setattr(backend_module, "_dcp_rank", lambda: (c, rank))
    req_to_token, rows = _layout(seq_lens, c, gen)
    pool = FakeMLAPool(rows, c, rank)
    gathered = torch.cat(keys).float()[:, None]
    meta = SimpleNamespace(dcp_kv_buffer=gathered, dcp_kv_indices=torch.arange(gathered.shape[0]))
    out_loc = torch.cat([req_to_token[b, n - k: n] for b, (n, k) in enumerate(zip(seq_lens, q_lens))])
    new_rows = torch.cat([keys[b][n - k: n] for b, (n, k) in enumerate(zip(seq_lens, q_lens))]).float()
    batch = SimpleNamespace(forward_mode=_mode("extend"), req_pool_indices=torch.arange(2), out_cache_loc=out_loc,
                            out_cache_loc_is_physical=False, attn_dcp_metadata=meta, seq_lens=torch.tensor(seq_lens),
                            extend_seq_lens=torch.tensor(q_lens))
    be = backend_module.K3DcpMLABackend(_runner(pool, req_to_token))
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=H, head_dim=L, v_head_dim=C, scaling=SCALE)
    be.init_forward_metadata(batch)
    o = be.forward_extend(q[..., :C].reshape(q.shape[0], -1).float(), new_rows[:, None, :C], None, layer, batch,
                          q_rope=q[..., C:].float(), k_rope=new_rows[:, None, C:])
    want, _ = _full(keys, q, seq_lens, q_lens)
    assert_close("o", want, o.view(-1, H, C), FP32_VS_FP64)
    mine = out_loc % c == rank  # the chunk's rows this rank owns were written to its pool
    assert_close("written rows", new_rows[mine], pool.buffer[out_loc[mine] // c, 0], 0.0)


def test_decode_contract_refuses_dcp_without_global_lengths(monkeypatch):
    monkeypatch.setattr(backend_module, "_dcp_rank", lambda: (2, 0))
    be = backend_module.K3DcpMLABackend(_runner(FakeMLAPool(8, 2, 0), torch.zeros(1, 8, dtype=torch.int64)))
    layer = SimpleNamespace(v_head_dim=C, scaling=SCALE)
    with pytest.raises(ValueError, match="causal_seqs"):
        be._run_decode_kernel(torch.zeros(1, 1, H, L), torch.zeros(4, PAGE, L), torch.zeros(1, 2, dtype=torch.int32),
                              torch.tensor([1]), 2, layer, cp_world=2, cp_rank=0, return_lse=True)
