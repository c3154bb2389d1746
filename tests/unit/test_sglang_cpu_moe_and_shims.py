"""The CPU MoE runner core (k3_sglang/sglang_cpu/moe_runner.py) and the shims that replace SGLang Triton kernels on
CPU (shims.py), against plain float64 formulas on fresh random inputs."""
from __future__ import annotations

import types

import pytest
import torch

from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4, quant_mxfp4
from k3_sglang.sglang_cpu import moe_runner, shims
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close

T, D, I, E, TOPK = 9, 48, 20, 6, 3


def _config(**kw):
    base = dict(activation="situ", is_gated=True, gemm1_alpha=4.0, gemm1_clamp_limit=25.0, swiglu_limit=None,
                apply_router_weight_on_input=False, no_combine=False, no_combine_keep_router_weight=False,
                routed_scaling_factor=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


def _reference(x, w13, w2, weights, ids, config, b13=None, b2=None):
    """Per token, per chosen expert, in float64: [gate|up] = x W13^T (+b13), act, down (+b2), weighted sum."""
    out = torch.zeros(x.shape[0], TOPK, x.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(TOPK):
            e = int(ids[t, j])
            if not 0 <= e < w13.shape[0]:
                continue
            xin = x[t].double() * (float(weights[t, j]) if config.apply_router_weight_on_input else 1.0)
            h = xin @ w13[e].double().t() + (b13[e].double() if b13 is not None else 0)
            gate, up = h[:I], h[I:]
            if config.activation == "situ":
                act = config.gemm1_alpha * torch.tanh(gate / config.gemm1_alpha) * torch.sigmoid(gate)
                up = config.gemm1_clamp_limit * torch.tanh(up / config.gemm1_clamp_limit)
            else:
                act = torch.nn.functional.silu(gate)
            y = (act * up) @ w2[e].double().t() + (b2[e].double() if b2 is not None else 0)
            out[t, j] = y * (1.0 if config.apply_router_weight_on_input or (
                config.no_combine and not config.no_combine_keep_router_weight)
                             else float(weights[t, j]))
    if config.no_combine:
        return out
    s = out.sum(1)
    return s * config.routed_scaling_factor if config.routed_scaling_factor is not None else s


@pytest.mark.parametrize("budget", [0, moe_runner.DENSE_BUDGET], ids=["grouped", "dense"])
@pytest.mark.parametrize("kw", [dict(), dict(activation="silu", gemm1_alpha=None, gemm1_clamp_limit=None),
                                dict(no_combine=True), dict(routed_scaling_factor=2.5),
                                dict(apply_router_weight_on_input=True)],
                         ids=["situ", "silu", "no-combine", "scaled", "weight-on-input"])
def test_grouped_experts_match_the_dense_reference(kw, budget):
    config = _config(**kw)
    x, w13, w2 = torch.randn(T, D), torch.randn(E, 2 * I, D) / D ** 0.5, torch.randn(E, D, I) / I ** 0.5
    weights = torch.rand(T, TOPK)
    # top-k never picks one expert twice; the dense path merges such picks' weights, which with the router weight
    # on the input changes the result, so that case draws distinct experts per token
    distinct = config.apply_router_weight_on_input and budget
    ids = (torch.stack([torch.randperm(E)[:TOPK] for _ in range(T)]) if distinct else
           torch.randint(0, E, (T, TOPK)))
    ids[2, 1] = -1  # another rank's expert (EP): skipped
    ids[4, 0] = E + 3
    b13, b2 = torch.randn(E, 2 * I), torch.randn(E, D)
    if not distinct:
        ids[6] = ids[6, 0]  # a token that picks one expert twice
    got = moe_runner.grouped_experts(x, w13, w2, weights, ids, config, b13, b2, dense_budget=budget)
    assert_close("grouped experts", _reference(x, w13, w2, weights, ids, config, b13, b2), got, FP32_VS_FP64)


def test_grouped_experts_read_bf16_weights_in_the_activation_dtype():
    config = _config()
    x = torch.randn(T, D)
    w13, w2 = (torch.randn(E, 2 * I, D) / D ** 0.5).bfloat16(), (torch.randn(E, D, I) / I ** 0.5).bfloat16()
    weights, ids = torch.rand(T, TOPK), torch.randint(0, E, (T, TOPK))
    got = moe_runner.grouped_experts(x, w13, w2, weights, ids, config)
    assert got.dtype == torch.float32
    assert_close("bf16 weights, fp32 activations", _reference(x, w13, w2, weights, ids, config), got, FP32_VS_FP64)


def test_mxfp4_upcast_is_the_reference_decode_along_any_axis():
    w = torch.randn(3, 8, 64)
    packed, scales = quant_mxfp4(w.reshape(-1, 64))
    packed, scales = packed.view(3, 8, 32), scales.view(3, 8, 2)
    got = shims.upcast_mxfp4(None, packed, scales, torch.bfloat16, -1)
    want = dequant_mxfp4(packed.reshape(-1, 32), scales.reshape(-1, 2), torch.bfloat16).view(3, 8, 64)
    assert_bit_exact("upcast, last axis", want, got)
    moved = shims.upcast_mxfp4(None, packed.transpose(1, 2).contiguous(), scales.transpose(1, 2).contiguous(),
                               torch.bfloat16, 1)
    assert_bit_exact("upcast, axis 1", want.transpose(1, 2).contiguous(), moved)
    calls = []
    shims.upcast_mxfp4(lambda *a, **k: calls.append(a), packed.float(), scales, torch.bfloat16, -1)
    assert len(calls) == 1, "anything but uint8 codes goes to the original"


def test_gated_rms_norm_shim_matches_the_formula():
    module = types.SimpleNamespace(eps=1e-6, weight=torch.randn(16), activation="sigmoid")
    x, g = torch.randn(5, 3, 16), torch.randn(5, 3, 16)
    got = shims.rms_norm_gated(None, module, x, g)
    xd = x.double()
    want = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * module.weight.double() * torch.sigmoid(g.double())
    assert_close("gated rms norm (sigmoid)", want, got, FP32_VS_FP64)
    module.activation = "swish"
    got = shims.rms_norm_gated(None, module, x, g)
    assert_close("gated rms norm (swish)", want / torch.sigmoid(g.double()) * torch.nn.functional.silu(g.double()),
                 got, FP32_VS_FP64)


def test_attn_res_mix_routes_cpu_to_the_fast_path_and_small_hidden_to_eager(monkeypatch):
    from sglang.srt.layers import attn_residual

    from k3_sglang.sglang_cpu import fast_ops

    seen = []
    monkeypatch.setattr(attn_residual, "aggregate_stream_torch", lambda *a: seen.append("torch") or "eager")
    monkeypatch.setattr(attn_residual, "get_cw", lambda proj, norm: "cw")
    monkeypatch.setattr(fast_ops, "attn_res_mix", lambda *a: seen.append(("fast", a[3], a[4])) or "fast")
    original = lambda *a: seen.append("triton") or "fused"  # noqa: E731
    proj = types.SimpleNamespace(bias=None)
    norm = types.SimpleNamespace(variance_size_override=None, variance_epsilon=1e-5)
    assert shims.attn_res_mix(original, torch.zeros(2, 128), None, 1, proj, norm) == "fast"
    with_bias = types.SimpleNamespace(bias=torch.zeros(1))
    assert shims.attn_res_mix(original, torch.zeros(2, 128), None, 1, with_bias, norm) == "eager"
    meta = torch.zeros(2, 1024, device="meta")  # a non-CPU tensor of a 1024-multiple width keeps the kernel
    assert shims.attn_res_mix(original, meta, None, 1, proj, norm) == "fused"
    meta_small = torch.zeros(2, 128, device="meta")
    assert shims.attn_res_mix(original, meta_small, None, 1, proj, norm) == "eager"
    assert seen == [("fast", "cw", 1e-5), "torch", "triton", "torch"]


def test_only_the_triton_runner_loses_its_fused_function():
    assert shims.no_fused_triton_moe(lambda *a: "fused", "none", "triton") is None
    assert shims.no_fused_triton_moe(lambda *a: "fused", "none", "deep_gemm") == "fused"


@pytest.mark.parametrize("native_bf16", [True, False], ids=["amx-or-avx512bf16", "avx2-only"])
def test_small_linear_shim_takes_small_bf16_cpu_linears_and_leaves_the_rest_to_sglang(monkeypatch, native_bf16):
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from k3_sglang.sglang_cpu import fast_ops

    monkeypatch.setattr(fast_ops, "native_reduced_gemm", lambda dtype: native_bf16)

    method = UnquantizedLinearMethod()
    seen = []
    original = lambda self, layer, x, bias=None: seen.append("sglang") or "sglang"  # noqa: E731
    small = types.SimpleNamespace(weight=(torch.randn(64, 32) / 32 ** 0.5).bfloat16())
    x = torch.randn(4, 32).bfloat16()
    got = shims.small_linear(original, method, small, x)
    assert_close("small linear shim", x.double() @ small.weight.double().t(), got, 1e-2)
    big = types.SimpleNamespace(weight=torch.randn(1024, 1024).bfloat16())
    x_big = torch.randn(1, 1024).bfloat16()
    got_big = shims.small_linear(original, method, big, x_big)
    if native_bf16:  # oneDNN's bf16 GEMM wins at this size
        assert got_big == "sglang"
    else:  # without a native bf16 GEMM every copyable weight runs in float32 here
        assert_close("big linear in float32", x_big.double() @ big.weight.double().t(), got_big, 1e-2)
    assert shims.small_linear(original, method, small, torch.zeros(4, 32)) == "sglang"  # float32 activations
    assert seen == ["sglang", "sglang"] if native_bf16 else ["sglang"]


def test_dense_experts_on_bf16_activations_compute_in_float32_and_round_once():
    config = _config()
    x = torch.randn(T, D).bfloat16()
    w13, w2 = (torch.randn(E, 2 * I, D) / D ** 0.5).bfloat16(), (torch.randn(E, D, I) / I ** 0.5).bfloat16()
    weights, ids = torch.rand(T, TOPK), torch.randint(0, E, (T, TOPK))
    ids[2, 1] = E + 1  # another rank's expert: skipped
    got = moe_runner.grouped_experts(x, w13, w2, weights, ids, config)  # T * E * 3I * D is under the dense budget
    assert got.dtype == torch.bfloat16
    assert_close("dense experts, bf16", _reference(x, w13, w2, weights, ids, config), got, 1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_activation_matches_situ_and_leaves_its_input_unwritten(dtype):
    """The activation works in place on its float32 copies: a float32 input (whose .float() is itself) must come back
    unchanged, and the result is SiTU in float64 up to rounding."""
    config = _config()
    x = (torch.randn(37, 2 * I) * 6).to(dtype)
    before = x.clone()
    got = moe_runner.gated_activation(x, config)
    assert_bit_exact("input", before, x)
    gate, up = x[:, :I].double(), x[:, I:].double()
    want = (4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate)) * (25.0 * torch.tanh(up / 25.0))
    assert_close("SiTU", want, got, FP32_VS_FP64 if dtype == torch.float32 else 2e-2)
