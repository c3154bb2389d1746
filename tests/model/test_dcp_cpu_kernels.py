"""The torch paths of SGLang's DCP Triton helpers (k3_sglang/dcp_mla/cpu_kernels.py) against SGLang's own Triton
kernels, run here under the interpreter on the same random inputs (NaN/-inf LSE entries and empty rows included):
what the CPU hooks substitute computes what SGLang computes on a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from k3_sglang.dcp_mla import cpu_kernels
from tests.utils.numerics import assert_bit_exact, assert_close

pytestmark = pytest.mark.triton


def _lses(n, b, h, gen):
    lses = torch.randn(n, b, h, generator=gen) * 3
    lses[0, 0, 0] = float("-inf")  # a rank without a key
    lses[:, 1, 1] = float("-inf")  # a row with no key anywhere
    lses[1, 0, 1] = float("nan")
    return lses


@pytest.mark.parametrize("base_e", [True, False])
def test_correct_attn_out_matches_sglang(base_e):
    from sglang.kernels.ops.attention.dcp_kernels import correct_attn_out

    gen = torch.Generator().manual_seed(0)
    n, b, h, d = 4, 4, 5, 16  # SGLang's kernels take power-of-2 rank counts and head dims
    out, lses = torch.randn(b, h, d, generator=gen), _lses(n, b, h, gen)
    for rank in range(n):
        want_o, want_lse = correct_attn_out(out, lses, rank, None, torch.empty(h, b, d), is_lse_base_on_e=base_e)
        got_o, got_lse = cpu_kernels.correct_attn_out_torch(out, lses, rank, torch.empty(h, b, d), base_e)
        assert_close(f"out rank {rank}", want_o, got_o, 1e-6)
        assert_close(f"lse rank {rank}", want_lse, got_lse, 1e-6)


def test_pack_a2a_send_matches_sglang():
    from sglang.kernels.ops.attention.dcp_kernels import dcp_pack_a2a_send

    gen = torch.Generator().manual_seed(1)
    n, b, h, d, b_max = 2, 3, 4, 8, 5
    out, lse = torch.randn(b, h, d, generator=gen), torch.randn(b, h, generator=gen)
    want_o, want_l = torch.full((n, b_max, h // n, d), 7.0), torch.full((n, b_max, h // n), 7.0)
    got_o, got_l = want_o.clone(), want_l.clone()
    dcp_pack_a2a_send(out, lse, want_o, want_l)
    cpu_kernels.pack_a2a_send_torch(out, lse, got_o, got_l)
    assert_bit_exact("send o", want_o, got_o)
    assert_bit_exact("send lse", want_l, got_l)


@pytest.mark.parametrize("base_e,return_lse", [(True, True), (False, True), (True, False)])
def test_lse_combine_matches_sglang(base_e, return_lse):
    from sglang.kernels.ops.attention.dcp_kernels import dcp_lse_combine_triton

    gen = torch.Generator().manual_seed(2)
    n, b, h, d = 4, 4, 5, 16  # SGLang's kernels take power-of-2 rank counts and head dims
    recv, lses = torch.randn(n, b, h, d, generator=gen), _lses(n, b, h, gen)
    want_o, want_lse = dcp_lse_combine_triton(recv, lses, is_lse_base_on_e=base_e, return_lse=return_lse)
    got_o, got_lse = cpu_kernels.lse_combine_torch(recv, lses, base_e, return_lse)
    assert_close("combined o", want_o, got_o, 1e-6)
    if return_lse:
        assert_close("combined lse", want_lse, got_lse, 1e-6)
    else:
        assert got_lse is None


@pytest.mark.parametrize("rope", [0, 16])
def test_mla_pool_read_matches_sglang(rope):
    from sglang.kernels.ops.kvcache.mla_buffer import get_mla_kv_buffer_triton

    gen = torch.Generator().manual_seed(4)
    pool, loc = torch.randn(20, 1, 32 + rope, generator=gen), torch.tensor([7, 0, 19, 7, 3])
    outs = []
    for fn in (get_mla_kv_buffer_triton, cpu_kernels.read_mla_rows_torch):
        nope, pe = torch.empty(5, 1, 32, dtype=torch.float64), torch.empty(5, 1, rope, dtype=torch.float64)
        fn(pool, loc, nope, pe if rope else None)
        outs.append((nope, pe))
    assert_bit_exact("nope", outs[0][0], outs[1][0])
    if rope:
        assert_bit_exact("rope", outs[0][1], outs[1][1])


@pytest.mark.parametrize("all_layers", [True, False])
def test_track_states_matches_sglang(all_layers):
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as sglang_track

    gen = torch.Generator().manual_seed(3)
    shape_conv, shape_ssm = ((3, 9, 4, 5), (3, 9, 2, 3, 3)) if all_layers else ((9, 4, 5), (9, 2, 3, 3))
    conv, ssm = torch.randn(*shape_conv, generator=gen), torch.randn(*shape_ssm, generator=gen)
    src, dst = torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7, 8])
    mask = torch.tensor([True, False, True, True])
    want_c, want_s, got_c, got_s = conv.clone(), ssm.clone(), conv.clone(), ssm.clone()
    fn = sglang_track.track_mamba_states_all_layers if all_layers else sglang_track.track_mamba_states_if_needed
    original = sglang_track._launch_track_mamba_states
    fn(want_c, want_s, src, mask, dst, 4)
    try:  # the hook in place of SGLang's launcher, as HookRegistry installs it
        sglang_track._launch_track_mamba_states = lambda *a: cpu_kernels.track_states_hook(original, *a)
        fn(got_c, got_s, src, mask, dst, 4)
    finally:
        sglang_track._launch_track_mamba_states = original
    assert_bit_exact("conv pool", want_c, got_c)
    assert_bit_exact("ssm pool", want_s, got_s)
    assert not torch.equal(want_c, conv)  # something was tracked


def test_extend_gather_metadata_matches_sglang(monkeypatch):
    """SGLang's planner (Triton index kernels) and ours, rank 1 of 2, chunks over page-aligned cached prefixes."""
    from types import SimpleNamespace

    from sglang.srt.layers.dcp import planner
    from sglang.kernels.ops.attention.kv_indices import create_chunked_prefix_cache_kv_indices

    c, rank = 2, 1
    parallel = SimpleNamespace(dcp_enabled=True, dcp_size=c, dcp_rank=rank, attn_dcp_size=c)
    translator = SimpleNamespace(translate_dcp_read_ids=lambda ids: ids // c)
    backend = SimpleNamespace(kv_index_translator=translator)
    monkeypatch.setattr(planner, "get_parallel", lambda: parallel)
    monkeypatch.setattr(planner, "get_attn_backend", lambda: backend)
    monkeypatch.setattr(planner, "get_device", lambda: SimpleNamespace(device="cpu"))
    import sglang.srt.model_executor.forward_context as fc
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(fc, "get_attn_backend", lambda: backend)
    monkeypatch.setattr(rc, "get_parallel", lambda: parallel)
    prefix, chunk = [4, 0, 6], [3, 5, 2]
    seq = torch.tensor([p + n for p, n in zip(prefix, chunk)])
    req_to_token = torch.randperm(200).view(4, 50).to(torch.int32)
    args = (seq, torch.tensor(prefix), prefix, torch.tensor(chunk), torch.tensor([2, 0, 3]), req_to_token,
            int(seq.sum()), torch.Size([300, 1, 24]), torch.float32, "cpu")
    want = planner.prepare_decode_context_parallel_metadata(*args, create_chunked_prefix_cache_kv_indices)
    got = cpu_kernels.extend_gather_metadata_torch(*args)
    for field in ("dcp_kv_indptr", "dcp_kv_indices", "dcp_local_prefix_kv_indices"):
        assert getattr(want, field).tolist() == getattr(got, field).tolist(), field
    assert want.dcp_extend_prefix_lens_sum == got.dcp_extend_prefix_lens_sum
    assert want.dcp_kv_buffer.shape == got.dcp_kv_buffer.shape and want.dcp_kv_buffer.dtype == got.dcp_kv_buffer.dtype


@pytest.mark.parametrize("rope", [0, 16])
def test_the_platform_mla_pool_reads_cpu_rows_as_sglangs_kernel_does(rope):
    """The k3_cpu platform's MLA pool (public seam `get_kv_pool_cls(kind="mla")`, replacing the old AROUND hook on
    `get_mla_kv_buffer_triton`): the rows `loc` names, split into nope and rope, cast to dst_dtype; bit-exact against
    SGLang's own method (its Triton kernel, under the interpreter here) and against plain indexing."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    from k3_sglang.platform_cpu import K3CpuPlatform
    from k3_sglang.sglang_cpu.mla_pool import K3CpuMLATokenToKVPool

    platform = K3CpuPlatform()
    assert platform.get_kv_pool_cls(kind="mla") is K3CpuMLATokenToKVPool
    assert issubclass(K3CpuMLATokenToKVPool, MLATokenToKVPool)
    assert platform.get_kv_pool_cls(kind="mha") is None and platform.get_kv_pool_cls(kind="dsa") is None

    gen = torch.Generator().manual_seed(11)
    lora = 32
    buffer = torch.randn(40, 1, lora + rope, generator=gen, dtype=torch.float64)
    loc = torch.tensor([39, 0, 17, 17, 5, 22])
    pool = K3CpuMLATokenToKVPool.__new__(K3CpuMLATokenToKVPool)  # the fields the read uses, no allocation
    pool.dtype, pool.kv_lora_rank, pool.qk_rope_head_dim = torch.float64, lora, rope
    pool.get_key_buffer = lambda layer_id: buffer if layer_id == 3 else None
    layer = SimpleNamespace(layer_id=3)
    for dst in (None, torch.float32):
        nope, pe = pool.get_mla_kv_buffer(layer, loc, dst)
        want_nope, want_pe = MLATokenToKVPool.get_mla_kv_buffer(pool, layer, loc, dst)
        dtype = dst or torch.float64
        assert nope.dtype == dtype and nope.shape == (6, 1, lora)
        assert_bit_exact("nope vs SGLang", want_nope, nope)
        assert_bit_exact("nope vs indexing", buffer[loc, :, :lora].to(dtype), nope)
        if rope:
            assert pe.shape == (6, 1, rope)
            assert_bit_exact("rope vs SGLang", want_pe, pe)
            assert_bit_exact("rope vs indexing", buffer[loc, :, lora:].to(dtype), pe)
        else:
            assert pe is None and want_pe is None
