"""Pure-PyTorch MXFP4 (OCP microscaling FP4) reference, design doc §4.

Layout: packed uint8 [N, K/2], two E2M1 codes per byte, LOW nibble = EVEN element; scales uint8 [N, K/32], one
E8M0 byte per 32 consecutive elements; value = e2m1(code) * 2^(scale - 127). E2M1: bit 3 is the sign, bits 0-2
index the magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
"""
from __future__ import annotations

import torch

GROUP = 32
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_table(device=None) -> torch.Tensor:
    """[16] float32: the value of every 4-bit E2M1 code."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def check_mxfp4_args(name: str, packed: torch.Tensor, scales: torch.Tensor) -> None:
    """Shared ValueError checks (reference and Triton op)."""
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"{name}: packed ({packed.dtype}) and scales ({scales.dtype}) must be uint8")
    if packed.dim() != 2 or scales.dim() != 2 or packed.shape[0] != scales.shape[0] or packed.shape[1] * 2 != scales.shape[1] * GROUP:
        raise ValueError(f"{name}: packed {tuple(packed.shape)} must be [N, K/2] and scales {tuple(scales.shape)} [N, K/32]")


def dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode MXFP4 weights.

    packed uint8 [N, K/2], scales uint8 [N, K/32] (E8M0). Returns [N, K] in dtype (the float32 product is exact;
    the cast to dtype rounds as torch does).
    """
    check_mxfp4_args("dequant_mxfp4", packed, scales)
    N, half = packed.shape
    table = e2m1_table(packed.device)
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(N, 2 * half).long()  # low nibble first
    vals = table[codes].view(N, -1, GROUP)
    mult = torch.exp2(scales.float() - 127.0)[..., None]
    return (vals * mult).reshape(N, 2 * half).to(dtype)


def quant_mxfp4(w: torch.Tensor, group_size: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode float weights as MXFP4 (round to nearest E2M1 code, ties to the smaller magnitude).

    w [N, K], K % 32 == 0. Per group of 32, e = ceil(log2(amax / 6)) clamped to [-127, 127] (e = -127 for an
    all-zero group), so the group max fits in 6 * 2^e. Returns (packed uint8 [N, K/2], scales uint8 [N, K/32]).
    dequant_mxfp4(*quant_mxfp4(w)) == w exactly whenever every group of w is representable.
    """
    if group_size != GROUP:
        raise ValueError(f"quant_mxfp4: group_size={group_size}; MXFP4 uses groups of {GROUP}")
    if w.dim() != 2 or w.shape[1] % GROUP:
        raise ValueError(f"quant_mxfp4: w {tuple(w.shape)} must be [N, K] with K % {GROUP} == 0")
    N, K = w.shape
    wg = w.to(torch.float64).view(N, K // GROUP, GROUP)
    amax = wg.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(amax / 6.0)).nan_to_num(-127.0, -127.0, -127.0).clamp(-127, 127)
    e = torch.where(amax / torch.exp2(e) > 6.0, e + 1, e).clamp(-127, 127)  # guard log2 rounding
    scaled = (wg / torch.exp2(e)).abs().clamp(max=6.0)
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64, device=w.device)
    idx = (scaled[..., None] - mags).abs().argmin(-1)  # first minimum: ties go to the smaller magnitude
    sign = torch.signbit(wg).long() << 3  # keeps -0.0 (and tiny negatives) as code 8
    codes = (idx | sign).view(N, K).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), (e + 127).view(N, K // GROUP).to(torch.uint8)
