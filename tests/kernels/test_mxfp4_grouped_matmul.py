"""Triton grouped MXFP4 expert matmul against the float64 reference."""
import pytest
import torch

from k3_sglang.kernels.mxfp4.grouped_matmul import mxfp4_grouped_matmul_triton
from k3_sglang.kernels.mxfp4.naive import mxfp4_grouped_matmul, quant_mxfp4
from tests.utils.numerics import FP32_VS_FP64, assert_close

pytestmark = pytest.mark.triton


def test_mxfp4_grouped_matmul():
    E, N, Kin = 3, 24, 128
    packed, scales = zip(*(quant_mxfp4(torch.randn(N, Kin)) for _ in range(E)))
    packed, scales = torch.stack(packed), torch.stack(scales)
    offsets = torch.tensor([0, 5, 5, 22])  # expert 1 gets no tokens
    x = torch.randn(22, Kin)
    ref = mxfp4_grouped_matmul(x.double(), offsets, packed, scales)
    assert_close("y", ref, mxfp4_grouped_matmul_triton(x, offsets, packed, scales), FP32_VS_FP64)


def test_mxfp4_grouped_matmul_invalid_args():
    packed, scales = torch.zeros(2, 4, 32, dtype=torch.uint8), torch.zeros(2, 4, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"x \(3, 60\)"):
        mxfp4_grouped_matmul_triton(torch.randn(3, 60), torch.tensor([0, 1, 3]), packed, scales)
    with pytest.raises(ValueError, match=r"expert_offsets \(2,\)"):
        mxfp4_grouped_matmul(torch.randn(3, 64), torch.tensor([0, 3]), packed, scales)
