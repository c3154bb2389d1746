"""Triton varlen chunked KDA prefill against the torch path in float64, on a poisoned slot pool."""
import pytest
import torch

from k3_sglang.kernels.kda.chunk import kda_chunk_prefill
from k3_sglang.kernels.kda.naive_decode import kda_prefill_torch
from tests.kernels.kda_cases import as64, make_pools, make_weights
from tests.utils.numerics import FP32_VS_FP64, assert_bit_exact, assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("H,K,V", [(2, 16, 12), (1, 8, 72)], ids=lambda x: str(x))  # 72: two V blocks of 64
def test_chunk_varlen(H, K, V):
    W = 4
    weights = make_weights(H, K, V, W)
    lens = [70, 2, 0, 9]  # crosses a chunk boundary, shorter than the window, empty, fresh
    T, D = sum(lens), 2 * H * K + H * V
    x, f, b, g_out = torch.randn(T, D), torch.randn(T, H * K), torch.randn(T, H), torch.randn(T, H * V)
    cu = torch.tensor([0, 70, 72, 72, 81], dtype=torch.int32)
    slots = torch.tensor([5, 0, 2, 3])
    init = torch.tensor([True, True, True, False])
    conv, state = make_pools(7, slots.tolist(), H, K, V, W)
    conv64, state64 = conv.double(), state.double()
    o_ref = kda_prefill_torch(x.double(), f.double(), b.double(), g_out.double(), cu, as64(weights), conv64, state64,
                              slots, init)
    conv_before, state_before = conv.clone(), state.clone()
    o = kda_chunk_prefill(x, f, b, g_out, cu, weights, conv, state, slots, init)
    assert_close("o", o_ref, o, FP32_VS_FP64)
    live = [5, 0, 3]
    assert_close("final states", state64[live], state[live], FP32_VS_FP64)
    assert_bit_exact("windows", conv64[live].float(), conv[live])
    untouched = [1, 2, 4, 6]  # 2 belongs to the empty sequence
    assert_bit_exact("untouched state slots", state_before[untouched], state[untouched])
    assert_bit_exact("untouched conv slots", conv_before[untouched], conv[untouched])


def test_chunk_invalid_args():
    weights = make_weights(2, 8, 8)
    conv, state = make_pools(2, [0], 2, 8, 8)
    x, f, b, g = torch.randn(5, 48), torch.randn(5, 16), torch.randn(5, 2), torch.randn(5, 16)
    with pytest.raises(ValueError, match=r"state_indices \(2,\)"):
        kda_chunk_prefill(x, f, b, g, torch.tensor([0, 5]), weights, conv, state, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="chunk_size=32"):
        kda_chunk_prefill(x, f, b, g, torch.tensor([0, 5]), weights, conv, state, torch.tensor([0]), chunk_size=32)
