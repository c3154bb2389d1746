"""Triton absorbed MLA decode and LSE merge against the float64 references."""
import pytest
import torch

from k3_sglang.kernels.mla.decode import merge_attention_states_triton, mla_decode_absorbed_triton
from k3_sglang.kernels.mla.naive import merge_attention_states, mla_decode_absorbed
from tests.utils.numerics import FP32_VS_FP64, assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_mla_decode_absorbed(num_splits):
    B, Hh, C, R, N = 3, 3, 12, 4, 50
    lens = [5, 0, 37]
    pool = torch.randn(N, C + R)
    q_lat = torch.randn(B, Hh, C + R)
    indices = torch.cat([torch.randperm(N)[:n] for n in lens])
    indptr = torch.tensor([0, 5, 5, 42])
    o_ref, lse_ref = mla_decode_absorbed(q_lat.double(), pool.double(), indices, indptr, C, 0.3)
    o, lse = mla_decode_absorbed_triton(q_lat, pool, indices, indptr, C, 0.3, num_splits=num_splits)
    assert o.shape == (B, Hh, C) and o.dtype == torch.float32
    assert_close("o", o_ref, o, FP32_VS_FP64)
    assert_close("lse", lse_ref, lse, FP32_VS_FP64)  # -inf at the empty request must match exactly
    assert bool((o[1] == 0).all())


def test_mla_decode_more_splits_than_rows():
    pool, q_lat = torch.randn(4, 20), torch.randn(1, 2, 20)
    o_ref, lse_ref = mla_decode_absorbed(q_lat.double(), pool.double(), torch.tensor([3, 1]), torch.tensor([0, 2]), 16, 1.0)
    parts, lses = mla_decode_absorbed_triton(q_lat, pool, torch.tensor([3, 1]), torch.tensor([0, 2]), 16, 1.0,
                                             num_splits=5, return_partials=True)
    assert parts.shape == (5, 1, 2, 16) and bool(torch.isneginf(lses[2:]).all())
    o, lse = merge_attention_states_triton(parts, lses)
    assert_close("o", o_ref, o, FP32_VS_FP64)
    assert_close("lse", lse_ref, lse, FP32_VS_FP64)


@pytest.mark.parametrize("P", [1, 4])
def test_merge_attention_states(P):
    B, H, D = 2, 3, 20
    outs, lses = torch.randn(P, B, H, D), torch.randn(P, B, H) * 3
    if P > 1:
        lses[1, 0] = float("-inf")
        outs[1, 0] = float("nan")  # ignored: its partial is empty
        lses[:, 1, 2] = float("-inf")  # one fully empty row
    o_ref, lse_ref = merge_attention_states(outs.double(), lses.double())
    o, lse = merge_attention_states_triton(outs, lses)
    assert_close("o", o_ref, o, FP32_VS_FP64)
    assert_close("lse", lse_ref, lse, FP32_VS_FP64)


def test_mla_decode_invalid_args():
    with pytest.raises(ValueError, match=r"kv_indptr \(2,\)"):
        mla_decode_absorbed_triton(torch.randn(2, 2, 8), torch.randn(4, 8), torch.tensor([0]), torch.tensor([0, 1]), 4, 1.0)
    with pytest.raises(ValueError, match=r"lses \(2, 1\)"):
        merge_attention_states_triton(torch.randn(2, 1, 1, 4), torch.zeros(2, 1))
