"""CPU fast paths of SGLang's own K3 (k3_sglang/sglang_cpu/fast_ops.py), against plain float64 formulas on fresh
random inputs (relative error by norm; NaN never passes)."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.sglang_cpu import fast_ops
from tests.utils.numerics import FP32_VS_FP64, assert_close

BF16_VS_FP64 = 1e-2  # one bf16 rounding of the output (8 mantissa bits)


def _attn_res_reference(prefix, bank, nvb, norm_w, proj_w, eps):
    """SGLang's eager AttnRes mixture (attn_residual.aggregate_stream_torch) in float64: rows = [bank[:, :nvb],
    prefix]; scores = proj(RMSNorm(rows)); softmax over rows; weighted sum of the rows."""
    rows = torch.cat([bank[:, :nvb], prefix[:, None]], 1).double()
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps) * norm_w.double()
    probs = torch.softmax(normed @ proj_w.double(), -1)  # [T, R]
    return (probs[..., None] * rows).sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,nvb", [(1, 1), (7, 2), (33, 3)])
def test_attn_res_mix_matches_the_eager_formula(T, nvb, dtype):
    H, eps = 96, 1e-5
    prefix, bank = torch.randn(T, H).to(dtype), (3 * torch.randn(T, 4, H)).to(dtype)
    bank[:, nvb:] = float("nan")  # entries past nvb are not live: reading them would poison the result
    norm_w, proj_w = 1 + 0.1 * torch.randn(H), torch.randn(H) / H ** 0.5
    got = fast_ops.attn_res_mix(prefix, bank, nvb, (norm_w * proj_w).float(), eps)
    assert got.dtype == dtype
    want = _attn_res_reference(prefix, bank, nvb, norm_w, proj_w, eps)
    assert_close("attn-res mix", want, got, FP32_VS_FP64 if dtype == torch.float32 else BF16_VS_FP64)


def test_attn_res_mix_with_no_live_block_is_the_prefix():
    prefix = torch.randn(5, 32)
    assert fast_ops.attn_res_mix(prefix, torch.full((5, 2, 32), float("nan")), 0, torch.randn(32), 1e-5) is prefix


def test_flush_denormals_zeroes_denormal_results_in_this_thread():
    tiny = torch.tensor([1e-30], dtype=torch.float32)
    try:
        assert fast_ops.flush_denormals()
        assert float(tiny * 1e-10) == 0.0  # 1e-40 is a float32 denormal: flushed
        assert float(tiny * 1e-5) == pytest.approx(1e-35, rel=1e-5)  # normal results are untouched
    finally:
        torch.set_flush_denormal(False)
    assert float(tiny * 1e-10) > 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,N,K,bias", [(1, 256, 128, False), (16, 96, 64, True), (2, 1024, 128, True)])
def test_small_linear_matches_the_float64_product(rows, N, K, bias, dtype):
    x, w = torch.randn(2, rows, K).to(dtype), (torch.randn(N, K) / K ** 0.5).to(dtype)
    b = torch.randn(N).to(dtype) if bias else None
    assert fast_ops.small_gemm(x, w)
    got = fast_ops.small_linear(x, w, b)
    assert got.dtype == dtype and got.shape == (2, rows, N)
    want = x.double() @ w.double().t() + (b.double() if bias else 0)
    assert_close("small linear", want, got, BF16_VS_FP64)
    assert_close("small linear against SGLang's bf16 GEMM", torch.nn.functional.linear(x, w, b).double(), got,
                 BF16_VS_FP64)


def test_small_gemm_takes_only_small_reduced_precision_cpu_products(monkeypatch):
    monkeypatch.setattr(fast_ops, "native_reduced_gemm", lambda dtype: True)  # a Xeon with AMX / AVX512-BF16
    w = torch.zeros(256, 128, dtype=torch.bfloat16)
    assert fast_ops.small_gemm(torch.zeros(16, 128, dtype=torch.bfloat16), w)
    assert not fast_ops.small_gemm(torch.zeros(17, 128, dtype=torch.bfloat16), w)  # 17 x 256 x 128 > 2^19
    assert not fast_ops.small_gemm(torch.zeros(1, 128), w.float())  # float32 already
    assert not fast_ops.small_gemm(torch.zeros(1, 4096, dtype=torch.bfloat16),
                                   torch.zeros(256, 4096, dtype=torch.bfloat16))  # a weight above 2^19: no copy


def test_without_a_native_bf16_gemm_every_copyable_weight_runs_in_float32(monkeypatch):
    monkeypatch.setattr(fast_ops, "native_reduced_gemm", lambda dtype: False)  # an AVX2-only CPU
    assert fast_ops.small_gemm(torch.zeros(512, 128, dtype=torch.bfloat16), torch.zeros(384, 128, dtype=torch.bfloat16))
    assert fast_ops.small_gemm(torch.zeros(1, 4096, dtype=torch.float16), torch.zeros(256, 4096, dtype=torch.float16))
    assert not fast_ops.small_gemm(torch.zeros(1, 4096, dtype=torch.bfloat16),
                                   torch.zeros(4097, 4096, dtype=torch.bfloat16))  # above 2^24 elements: no copy
    assert not fast_ops.small_gemm(torch.zeros(512, 128), torch.zeros(384, 128))  # float32 already


def test_native_reduced_gemm_asks_onednn():
    assert fast_ops.native_reduced_gemm(torch.bfloat16) is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_float32_copy_is_made_once_and_again_after_an_in_place_write():
    w = torch.randn(8, 4).bfloat16()
    first = fast_ops.float32_copy(w)
    assert first.dtype == torch.float32 and torch.equal(first, w.float())
    assert fast_ops.float32_copy(w) is first
    with torch.no_grad():
        w.copy_(torch.randn(8, 4))  # a weight update in place
    again = fast_ops.float32_copy(w)
    assert again is not first and torch.equal(again, w.float())
    f32 = torch.randn(3, 3)
    assert fast_ops.float32_copy(f32) is f32
