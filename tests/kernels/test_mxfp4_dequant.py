"""Triton MXFP4 dequantisation: bit-exact against the reference.

Scale bytes whose products are fp32 subnormals (below ~2^-126) are excluded: GPUs flush them to zero.
"""
import pytest
import torch

from k3_sglang.kernels.mxfp4.dequant import dequant_mxfp4_triton
from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4
from tests.utils.numerics import assert_bit_exact

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequant_mxfp4(dtype):
    N, K = 5, 96  # K/2 = 48 bytes per row: not a power of two
    packed = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    scales = torch.randint(100, 150, (N, K // 32), dtype=torch.uint8)
    scales[0, 0], scales[1, 1] = 254, 7  # the largest finite scale (6 * 2^127 overflows to inf in both) and a small one
    assert_bit_exact("dequant", dequant_mxfp4(packed, scales, dtype), dequant_mxfp4_triton(packed, scales, dtype))


def test_dequant_mxfp4_invalid_args():
    with pytest.raises(ValueError, match=r"scales \(2, 3\)"):
        dequant_mxfp4_triton(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8))
