"""CPU fast paths for SGLang's own K3 on the k3_cpu platform, each behind one of SGLang's seams (hooks.py, moe_runner.py,
linear_method.py) and each checked against a float64 reference (tests/unit/test_sglang_cpu_fast_ops.py).

On a CPU a small model is bound by the number of torch ops per layer, not by FLOPs: these paths compute the same
values as SGLang's eager fallbacks with fewer, larger ops.
"""
from __future__ import annotations

import torch


def attn_res_mix(prefix_sum: torch.Tensor, bank: torch.Tensor, nvb: int, cw: torch.Tensor, eps: float) -> torch.Tensor:
    """AttnRes pre-norm mixture, the math of SGLang's Triton score + combine kernels (`attn_residual._mix_fused`).

    prefix_sum [T, H]; bank [T, >= nvb, H] (the first nvb entries are live); cw [H] float32, the fused
    score_norm.weight * score_proj.weight (`attn_residual.get_cw`); eps the score norm's epsilon.
    rows = [bank[:, :nvb], prefix_sum] [T, R, H] in float32; score_r = (rows_r . cw) * rsqrt(mean(rows_r^2) + eps);
    returns sum_r softmax(score)_r * rows_r [T, H] in prefix_sum.dtype (prefix_sum itself when nvb == 0).
    """
    if nvb == 0:
        return prefix_sum
    rows = torch.cat([bank[:, :nvb], prefix_sum.unsqueeze(1)], dim=1).float()  # [T, R, H]
    scores = (rows @ cw.float()) * torch.rsqrt(rows.square().mean(-1) + eps)  # [T, R]
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs.unsqueeze(1), rows).squeeze(1).to(prefix_sum.dtype)


def flush_denormals() -> bool:
    """Flush float denormals to zero (x86 FTZ/DAZ) in this thread and the threads it starts after this call (torch's
    OpenMP workers inherit the creating thread's floating-point state); True where the CPU supports it.

    KDA's chunked prefill multiplies decays of up to 64 tokens (2^(G_i - G_j), exponents far below -126), and on x86
    every operation on a denormal result takes a microcode assist: measured on this repo's Xeons, SGLang's K3 KDA
    extend (kda_ops.kda_extend) runs about 3x faster with denormals flushed. Values below 1.2e-38 become 0, far below
    float32's resolution of the O(1) terms they are added to (the tests compare against float64 references)."""
    import torch

    return bool(torch.set_flush_denormal(True))
