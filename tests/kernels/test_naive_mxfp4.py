"""MXFP4 reference against hand-computed bytes, and the quant/dequant round trip."""
import pytest
import torch

from k3_sglang.kernels.mxfp4 import dequant_mxfp4, quant_mxfp4
from k3_sglang.kernels.mxfp4.naive import E2M1_MAGNITUDES
from tests.utils.numerics import assert_bit_exact


def one_group(byte: int, scale: int) -> torch.Tensor:
    return dequant_mxfp4(torch.full((1, 16), byte, dtype=torch.uint8), torch.tensor([[scale]], dtype=torch.uint8))


def test_dequant_mxfp4_hand_bytes():
    assert one_group(0x21, 127)[0, :2].tolist() == [0.5, 1.0]  # low nibble (1 -> 0.5) is the even element
    assert one_group(0x21, 128)[0, :2].tolist() == [1.0, 2.0]  # scale 128 doubles
    assert one_group(0x21, 125)[0, :2].tolist() == [0.125, 0.25]
    assert one_group(0xA9, 127)[0, :2].tolist() == [-0.5, -1.0]  # bit 3 is the sign
    assert one_group(0x7F, 127)[0, :2].tolist() == [-6.0, 6.0]
    assert one_group(0x08, 127)[0, 0].item() == 0.0  # -0
    for code, mag in enumerate(E2M1_MAGNITUDES):
        assert one_group(code, 127)[0, 0].item() == mag
    assert one_group(0x21, 127).dtype == torch.float32
    assert dequant_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8),
                         torch.bfloat16).dtype == torch.bfloat16


def test_dequant_mxfp4_groups():
    packed = torch.tensor([[0x21] * 16 + [0x43] * 16], dtype=torch.uint8)
    out = dequant_mxfp4(packed, torch.tensor([[127, 130]], dtype=torch.uint8))
    assert out[0, :32].tolist() == [0.5, 1.0] * 16
    assert out[0, 32:].tolist() == [1.5 * 8, 2.0 * 8] * 16


def test_quant_mxfp4_round_trip():
    N, K = 3, 96
    codes = torch.randint(0, 16, (N, K))
    exps = torch.randint(-6, 6, (N, K // 32, 1)).float()
    mags = torch.tensor(E2M1_MAGNITUDES)
    signs = torch.where(codes >= 8, -1.0, 1.0)
    w = (signs * mags[codes % 8]).view(N, K // 32, 32) * torch.exp2(exps)
    w = w.view(N, K)
    packed, scales = quant_mxfp4(w)
    assert packed.shape == (N, K // 2) and scales.shape == (N, K // 32)
    assert_bit_exact("representable round trip", w, dequant_mxfp4(packed, scales))
    x = torch.randn(N, K)
    packed, scales = quant_mxfp4(x)
    approx = dequant_mxfp4(packed, scales)
    assert_bit_exact("idempotent", approx, dequant_mxfp4(*quant_mxfp4(approx)))
    half_top_step = torch.exp2(scales.float() - 127).repeat_interleave(32, 1)  # (6 - 4) / 2 * 2^e
    assert bool(((approx - x).abs() <= half_top_step).all())
    amax = x.view(N, -1, 32).abs().amax(-1).repeat_interleave(32, 1)
    assert bool((amax <= 6 * half_top_step).all()) and bool((amax > 3 * half_top_step).all())  # tightest e
    with pytest.raises(ValueError, match=r"w \(3, 40\)"):
        quant_mxfp4(torch.randn(3, 40))
    with pytest.raises(ValueError, match=r"scales \(3, 2\)"):
        dequant_mxfp4(packed, scales[:, :2])
