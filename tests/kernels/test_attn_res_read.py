"""Triton AttnRes read against the float64 reference."""
import pytest
import torch

from k3_sglang.kernels.attn_res.naive import attn_res_read
from k3_sglang.kernels.attn_res.read import attn_res_read_triton
from tests.utils.numerics import FP32_VS_FP64, assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("N,T,D", [(1, 2, 40), (9, 3, 1100)], ids=lambda x: str(x))
def test_attn_res_read(N, T, D):
    cand, w = torch.randn(N, T, D) * torch.rand(N, 1, 1) * 4, torch.randn(D)
    out = attn_res_read_triton(cand, w, 1e-5)
    assert_close("read", attn_res_read(cand.double(), w.double(), 1e-5), out, FP32_VS_FP64)


def test_attn_res_read_strided_bank():
    bank = torch.randn(3, 8, 5, 64)[:, :, 2]  # [N, T, D] view with a non-trivial T stride
    w = torch.randn(64)
    assert_close("strided", attn_res_read(bank.double(), w.double(), 1e-6), attn_res_read_triton(bank, w, 1e-6),
                 FP32_VS_FP64)


def test_attn_res_read_invalid_args():
    with pytest.raises(ValueError, match=r"candidates \(17, 1, 8\)"):
        attn_res_read_triton(torch.randn(17, 1, 8), torch.randn(8), 1e-5)
