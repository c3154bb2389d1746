"""The dispatch layer: device defaults, explicit backends, clear errors; the pooled varlen prefill."""
import pytest
import torch

from k3_sglang.kernels import dispatch
from k3_sglang.kernels.attn_res.naive import attn_res_read
from k3_sglang.kernels.kda.naive import chunk_kda, gated_rms_norm, kda_gate, l2_normalize, short_conv_silu
from tests.kernels.kda_cases import make_pools, make_weights
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close


def test_dispatch_defaults_and_errors():
    assert dispatch.resolve("attn_res_read", torch.device("cpu")) is attn_res_read
    assert dispatch.REGISTRY.backends("kda_prefill") == ("torch", "triton")
    assert set(dispatch.REGISTRY.ops()) >= {"kda_decode", "kda_verify", "mla_dcp", "dequant_mxfp4"}
    with pytest.raises(ValueError, match="has no backend 'cuda-graph'; supported: torch, triton"):
        dispatch.resolve("kda_decode", torch.device("cpu"), "cuda-graph")
    with pytest.raises(ValueError, match="unknown kernel op 'kda_fwd'; supported: .*kda_decode"):
        dispatch.resolve("kda_fwd", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown kernel backend 'cutlass'"):
        dispatch.REGISTRY.register("x", "cutlass", "a:b")


@pytest.mark.triton
def test_dispatch_triton_on_cpu_interpreter():
    cand, w = torch.randn(3, 2, 16), torch.randn(16)
    out = dispatch.attn_res_read(cand, w, 1e-5, backend="triton")
    assert_close("triton read", attn_res_read(cand.double(), w.double(), 1e-5), out, FP32_VS_FP64)


def test_kda_prefill_varlen_from_pool():
    H, K, V, W = 2, 8, 12, 4
    weights = make_weights(H, K, V, W)
    lens = [5, 0, 70]
    T, D = sum(lens), 2 * H * K + H * V
    x, f, b, g_out = torch.randn(T, D), torch.randn(T, H * K), torch.randn(T, H), torch.randn(T, H * V)
    cu = torch.tensor([0, 5, 5, 75])
    slots, init = torch.tensor([3, 1, 0]), torch.tensor([True, True, False])
    conv, state = make_pools(5, slots.tolist(), H, K, V, W)
    conv_ref, state_ref = conv.clone(), state.clone()
    o = dispatch.kda_prefill(x, f, b, g_out, cu, weights, conv, state, slots, init)
    for i, (lo, hi) in enumerate([(0, 5), (75, 75), (5, 75)]):
        if hi <= lo:
            continue
        slot = slots[[0, 2][i // 2]].item()
        window = conv_ref[slot] if init[[0, 2][i // 2]] else None
        y, window = short_conv_silu(x[lo:hi].double(), weights.conv_weight.double(), None if window is None else window.double())
        q, k, v = y.split([H * K, H * K, H * V], -1)
        g = kda_gate(f[lo:hi].double().view(-1, H, K), weights.A_log.double(), weights.dt_bias.double(), -5.0)
        s0 = state_ref[slot].double() if init[[0, 2][i // 2]] else None
        out, S = chunk_kda(l2_normalize(q.reshape(-1, H, K)), l2_normalize(k.reshape(-1, H, K)), v.reshape(-1, H, V), g,
                           torch.sigmoid(b[lo:hi].double()), K ** -0.5, s0)
        ref = gated_rms_norm(out, g_out[lo:hi].double().view(-1, H, V), weights.o_norm.double(), 1e-5)
        assert_close(f"o seq {i}", ref.reshape(-1, H * V), o[lo:hi], FP32_VS_FP64)
        assert_close(f"state seq {i}", S, state[slot], FP32_VS_FP64)
        assert_bit_exact(f"window seq {i}", window.float(), conv[slot])
    assert_bit_exact("empty sequence's slot untouched", state_ref[1], state[1])
    assert_bit_exact("unused slots untouched", state_ref[[2, 4]], state[[2, 4]])
