"""Triton: MXFP4 -> float dequantisation of routed-expert weights (bit-exact with naive.dequant_mxfp4)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.mxfp4.naive import GROUP, check_mxfp4_args


@triton.jit
def _e2m1(code):
    """4-bit E2M1 code (int32) -> fp32: bits 2..1 exponent, bit 0 mantissa, bit 3 sign."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, m * 0.5, (1.0 + 0.5 * m) * tl.where(e == 1, 1.0, tl.where(e == 2, 2.0, 4.0)))
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def dequant_mxfp4_kernel(packed_ptr, scale_ptr, out_ptr, half_k, BLOCK: tl.constexpr, GROUP_SIZE: tl.constexpr):
    i_n, i_k = tl.program_id(0), tl.program_id(1)
    cols = i_k * BLOCK + tl.arange(0, BLOCK)  # byte index within the row
    mask = cols < half_k
    row = i_n.to(tl.int64)
    byte = tl.load(packed_ptr + row * half_k + cols, mask=mask, other=0).to(tl.int32)
    s = tl.load(scale_ptr + row * (half_k * 2 // GROUP_SIZE) + cols * 2 // GROUP_SIZE, mask=mask, other=127).to(tl.int32)
    bits = tl.where(s == 0, 0x00400000, s << 23)  # 2^(s - 127) as fp32 bits (s = 0 is the subnormal 2^-127)
    mult = bits.to(tl.float32, bitcast=True)
    lo = _e2m1(byte & 0xF) * mult
    hi = _e2m1(byte >> 4) * mult
    dst = out_ptr + row * half_k * 2 + cols * 2
    tl.store(dst, lo.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + 1, hi.to(out_ptr.dtype.element_ty), mask=mask)


def dequant_mxfp4_triton(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """packed uint8 [N, K/2] (low nibble = even element), scales uint8 [N, K/32] (E8M0). Returns [N, K] in dtype."""
    check_mxfp4_args("dequant_mxfp4", packed, scales)
    assert packed.is_contiguous() and scales.is_contiguous(), "dequant_mxfp4: packed and scales must be contiguous"
    N, half_k = packed.shape
    out = torch.empty(N, half_k * 2, dtype=dtype, device=packed.device)
    BLOCK = min(1024, triton.next_power_of_2(half_k))
    dequant_mxfp4_kernel[(N, triton.cdiv(half_k, BLOCK))](packed, scales, out, half_k, BLOCK=BLOCK, GROUP_SIZE=GROUP)
    return out
