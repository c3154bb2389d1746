"""The k3_cpu platform's `post_load_model` (SGLang's public seam after the weights load) gives SGLang's own layer
objects their CPU forms (sglang_cpu/cpu_layers.py): a real SGLang ReplicatedLinear and FusedRMSNormGated, fresh
random inputs, against float64 references; objects of other classes are left alone."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.sglang_cpu import cpu_layers
from tests.utils.numerics import FP32_VS_FP64, assert_close


def _model():
    from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated
    from sglang.srt.layers.linear import ReplicatedLinear

    torch.manual_seed(0)
    linear = ReplicatedLinear(64, 48, bias=True, params_dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64).bfloat16() / 8)
        linear.bias.copy_(torch.randn(48).bfloat16())
    norm = FusedRMSNormGated(48, eps=1e-6, activation="sigmoid", dtype=torch.float32)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    return torch.nn.ModuleDict({"linear": linear, "norm": norm, "other": torch.nn.Linear(4, 4)})


def test_post_load_model_adopts_the_cpu_forms_and_they_match_float64():
    from k3_sglang.platform_cpu import K3CpuPlatform

    model = _model()
    linear, norm = model["linear"], model["norm"]
    K3CpuPlatform().post_load_model(model)
    assert type(linear.quant_method) is cpu_layers.K3CpuLinearMethod
    assert type(norm) is cpu_layers.K3CpuFusedRMSNormGated and type(model["other"]) is torch.nn.Linear
    x = torch.randn(3, 64).bfloat16()
    out = linear(x)
    out = out[0] if isinstance(out, tuple) else out
    want = x.double() @ linear.weight.double().T + linear.bias.double()
    assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
    assert_close("CPU linear form", want, out, 2e-2)  # bf16 output rounding
    h, g = torch.randn(5, 48), torch.randn(5, 48)
    got = norm(h, g)
    hd = h.double()
    ref = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double() * torch.sigmoid(g.double())
    assert_close("CPU gated norm form", ref, got, FP32_VS_FP64)


def test_adopt_counts_and_is_idempotent():
    model = _model()
    assert cpu_layers.adopt(model) == {"linear": 1, "gated_norm": 1}
    assert cpu_layers.adopt(model) == {"linear": 0, "gated_norm": 0}  # already in their CPU forms


@pytest.mark.parametrize("residual", [True, False])
def test_the_gated_norm_form_leaves_what_it_does_not_cover_to_sglang(monkeypatch, residual):
    from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated

    model = _model()
    cpu_layers.adopt(model)
    seen = []
    monkeypatch.setattr(FusedRMSNormGated, "forward", lambda self, *a: seen.append(a) or "sglang")
    h = torch.randn(2, 48)
    out = model["norm"](h, h, h if residual else None)
    assert (out == "sglang") is residual and len(seen) == int(residual)
