"""The one tolerance rule for kernel tests (see docs/testing.md).

assert_close: relative error by norm, ||out - ref||_2 / ||ref||_2 computed in float64, must be <= ratio.
NaN or Inf in `out` never passes (unless `ref` has the same non-finite value at the same place), so poisoned
outputs that a kernel forgot to write fail loudly. assert_bit_exact: for data movement, dequantisation and
untouched pool slots.
"""
from __future__ import annotations

import torch

# Defaults by what is compared: a fp32 path against a float64 reference, or a reference against a reference.
FP32_VS_FP64 = 5e-3
EXACT_MATH_FP64 = 1e-10


def rel_err(ref: torch.Tensor, out: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if any mismatch in non-finite entries)."""
    r, o = ref.detach().to("cpu", torch.float64), out.detach().to("cpu", torch.float64)
    same_nonfinite = (~torch.isfinite(r)) & ((r == o) | (torch.isnan(r) & torch.isnan(o)))
    if bool((~torch.isfinite(o) & ~same_nonfinite).any()) or bool((~torch.isfinite(r) & ~same_nonfinite).any()):
        return float("nan")
    r, o = torch.where(same_nonfinite, 0.0, r), torch.where(same_nonfinite, 0.0, o)
    denom = r.norm().item()
    num = (o - r).norm().item()
    return num / denom if denom > 0 else num


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float) -> None:
    """Fail unless shapes match and rel_err(ref, out) <= ratio (NaN never passes)."""
    assert tuple(ref.shape) == tuple(out.shape), f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    err = rel_err(ref, out)
    assert err <= ratio, f"{name}: relative error {err:.3e} > {ratio:.1e}"  # NaN compares False


def assert_bit_exact(name: str, ref: torch.Tensor, out: torch.Tensor) -> None:
    """Fail unless dtype, shape and every bit match (NaN payloads included)."""
    assert ref.dtype == out.dtype, f"{name}: dtype {out.dtype} != reference {ref.dtype}"
    assert tuple(ref.shape) == tuple(out.shape), f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    r, o = ref.detach().cpu().contiguous(), out.detach().cpu().contiguous()
    if r.is_floating_point():
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[r.element_size()]
        r, o = r.view(view), o.view(view)
    mismatch = (r != o).sum().item()
    assert mismatch == 0, f"{name}: {mismatch} of {r.numel()} elements differ bitwise"
