"""The Triton LSE merge of partial attentions against the float64 reference (the MLA decode itself: test_mla_dcp.py)."""
import pytest
import torch

from k3_sglang.kernels.mla.decode import merge_attention_states_triton
from k3_sglang.kernels.mla.naive import merge_attention_states
from tests.utils.numerics import FP32_VS_FP64, assert_close

pytestmark = pytest.mark.triton


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


def test_merge_invalid_args():
    with pytest.raises(ValueError, match=r"lses \(2, 1\)"):
        merge_attention_states_triton(torch.randn(2, 1, 1, 4), torch.zeros(2, 1))
