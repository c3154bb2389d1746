"""Triton: grouped expert matmul that consumes MXFP4 weights directly (dequantised tile by tile in registers)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from k3_sglang.kernels.mxfp4.dequant import _e2m1
from k3_sglang.kernels.mxfp4.naive import GROUP, check_grouped_args


@triton.jit
def mxfp4_grouped_matmul_kernel(
    x_ptr, off_ptr, packed_ptr, scale_ptr, y_ptr, N, Kin,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_SIZE: tl.constexpr, DOT_FP32: tl.constexpr,
):
    i_e, i_n = tl.program_id(0), tl.program_id(1)
    lo = tl.load(off_ptr + i_e).to(tl.int64)
    hi = tl.load(off_ptr + i_e + 1).to(tl.int64)
    nn = i_n * BN + tl.arange(0, BN)
    mn = nn < N
    half = Kin // 2
    w_base = packed_ptr + i_e.to(tl.int64) * N * half + nn[:, None].to(tl.int64) * half
    s_base = scale_ptr + i_e.to(tl.int64) * N * (Kin // GROUP_SIZE) + nn[:, None].to(tl.int64) * (Kin // GROUP_SIZE)
    for m0 in range(lo, hi, BM):
        mm = m0 + tl.arange(0, BM)
        m_m = mm < hi
        acc = tl.zeros([BM, BN], tl.float32)
        for k0 in range(0, Kin, BK):
            jj = k0 // 2 + tl.arange(0, BK // 2)  # byte columns
            m_w = mn[:, None] & (jj[None, :] < half)
            byte = tl.load(w_base + jj[None, :], mask=m_w, other=0).to(tl.int32)
            sb = tl.load(s_base + (jj[None, :] * 2) // GROUP_SIZE, mask=m_w, other=127).to(tl.int32)
            mult = tl.where(sb == 0, 0x00400000, sb << 23).to(tl.float32, bitcast=True)
            w = tl.join(_e2m1(byte & 0xF) * mult, _e2m1(byte >> 4) * mult).reshape([BN, BK])  # even, odd interleaved
            kk = k0 + tl.arange(0, BK)
            xt = tl.load(x_ptr + mm[:, None] * Kin + kk[None, :], mask=m_m[:, None] & (kk[None, :] < Kin), other=0.0)
            if DOT_FP32:
                acc += tl.dot(xt.to(tl.float32), tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(xt, tl.trans(w.to(xt.dtype)))
        tl.store(y_ptr + mm[:, None] * N + nn[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_m[:, None] & mn[None, :])


def mxfp4_grouped_matmul_triton(x: torch.Tensor, expert_offsets: torch.Tensor, packed: torch.Tensor,
                                scales: torch.Tensor) -> torch.Tensor:
    """x [M, Kin] grouped by expert, expert_offsets [E+1], packed uint8 [E, N, Kin/2], scales uint8 [E, N, Kin/32].

    Returns y [M, N] in x.dtype; rows outside every expert's range are 0. Kin must be a multiple of 64.
    """
    check_grouped_args("mxfp4_grouped_matmul", x, expert_offsets, packed, scales)
    if x.shape[1] % 64:
        raise ValueError(f"mxfp4_grouped_matmul: x {tuple(x.shape)} needs Kin % 64 == 0")
    assert x.is_contiguous() and packed.is_contiguous() and scales.is_contiguous(), "mxfp4_grouped_matmul: contiguous"
    M, Kin = x.shape
    E, N = packed.shape[:2]
    y = torch.zeros(M, N, dtype=x.dtype, device=x.device)
    dot_fp32 = x.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    BN = min(128, max(16, triton.next_power_of_2(N)))
    mxfp4_grouped_matmul_kernel[(E, triton.cdiv(N, BN))](
        x, expert_offsets, packed, scales, y, N, Kin, BM=16, BN=BN, BK=64, GROUP_SIZE=GROUP, DOT_FP32=dot_fp32,
        num_warps=4)
    return y
