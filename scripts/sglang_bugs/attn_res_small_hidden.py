"""Reproducer: SGLang 0.5.23's AttnRes combine kernel leaves its output unwritten for a hidden size below 1024.

`sglang.srt.layers.attn_residual._mix_fused` launches `_combine_kernel` on a grid of (T, H // _BLOCK_H) with
_BLOCK_H = 1024: for H = 128 that is zero programs, and the `torch.empty` output is returned as it was allocated.
`aggregate_stream` guards this shape (H % _BLOCK_H != 0 -> aggregate_stream_torch); `_aggregate` (every AttnRes
read of a layer) and `_aggregate_fused_add` reach `_mix_fused` without the guard.

Run on a GPU, or on CPU with TRITON_INTERPRET=1:  python scripts/sglang_bugs/attn_res_small_hidden.py
Exit status 1 and "REPRODUCED" when the output differs from SGLang's own eager reference, 0 when it matches.
"""
from __future__ import annotations

import sys

import torch


def differing_outputs(H: int, T: int = 4, nvb: int = 2) -> tuple[int, int]:
    """(outputs of _mix_fused that differ from aggregate_stream_torch, outputs never written) at hidden size H."""
    from sglang.srt.layers import attn_residual

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randn(T, H, generator=gen).to(device)
    bank = torch.randn(T, nvb + 1, H, generator=gen).to(device)
    proj_w = torch.randn(1, H, generator=gen).to(device)
    norm_w = torch.rand(H, generator=gen).to(device) + 0.5
    eps = 1e-6

    class Proj(torch.nn.Module):  # the ReplicatedLinear(H, 1) interface: forward returns (y, bias)
        weight = proj_w

        def forward(self, x):
            return x @ proj_w.t(), None

    class Norm(torch.nn.Module):  # the RMSNorm interface the kernels read: weight, variance_epsilon
        weight = norm_w
        variance_epsilon = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_w

    saved_empty_like = torch.empty_like  # the output buffer: NaN-filled, so "never written" is visible
    torch.empty_like = lambda *a, **k: saved_empty_like(*a, **k).fill_(float("nan"))
    try:
        fused = attn_residual._mix_fused(prefix, bank, nvb, Proj(), Norm())
    finally:
        torch.empty_like = saved_empty_like
    eager = attn_residual.aggregate_stream_torch(prefix, bank, nvb, Proj(), Norm())
    bad = (~torch.isclose(fused.float(), eager.float(), rtol=1e-3, atol=1e-3)).sum().item()
    return int(bad), int(torch.isnan(fused).sum().item())


def main() -> int:
    bad, unwritten = differing_outputs(128)
    print(f"_mix_fused at H=128: {bad} outputs differ from aggregate_stream_torch, {unwritten} never written")
    control, _ = differing_outputs(1024)
    print(f"control, _mix_fused at H=1024: {control} outputs differ")
    if bad and not control:
        print("REPRODUCED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
