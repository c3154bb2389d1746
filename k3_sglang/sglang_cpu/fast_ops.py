"""CPU fast paths for SGLang's own K3 on the k3_cpu platform, each behind one of SGLang's seams (hooks.py, moe_runner.py,
shims.py) and each checked against a float64 reference (tests/unit/test_sglang_cpu_fast_ops.py).

On a CPU a small model is bound by the number of torch ops per layer, not by FLOPs: these paths compute the same
values as SGLang's eager fallbacks with fewer, larger ops.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

# A reduced-precision (bf16/fp16) GEMM on CPU goes through oneDNN, which costs ~25 us per call whatever its size on
# this repo's Xeons, against ~4 us for a float32 GEMM of a decode-sized problem (1 x 128 x 256). Up to this many
# multiply-adds (rows x N x K) a linear runs in float32 against a cached float32 copy of its weight; above it the
# bf16 GEMM (AMX) wins. Weights are copied only when N x K <= SMALL_GEMM_MACS, so at most 2 MiB each.
SMALL_GEMM_MACS = 1 << 19
# On a CPU where oneDNN has no native reduced-precision GEMM (no AVX512-BF16 / AMX, e.g. an AVX2-only EPYC) PyTorch's
# bf16 GEMM is a slow fallback: 10-15x a float32 GEMM of the same size at prefill shapes (512 x 128 x 384: 5.9 ms
# against 0.5 ms, measured 2026-12-07 on this repo's AMD EPYC VM). There every linear whose weight has at most this
# many elements runs in float32 on its cached float32 copy (at most 64 MiB each), whatever the number of rows.
FP32_COPY_ELEMENTS = 1 << 24


@functools.cache
def native_reduced_gemm(dtype: torch.dtype) -> bool:
    """Whether oneDNN runs dtype (bf16 or fp16) GEMMs natively on this CPU; True when PyTorch cannot say."""
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return True


def float32_copy(w: torch.Tensor) -> torch.Tensor:
    """A float32 copy of weight w, made once and kept on w (`_k3_fp32`); made again when w is written in place
    (its version counter moves) or its storage changes. w itself when it is float32 already."""
    if w.dtype == torch.float32:
        return w
    try:
        version = w._version
    except RuntimeError:  # an inference tensor has no version counter
        version = None
    key = (w.data_ptr(), version)
    cached = getattr(w, "_k3_fp32", None)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, w.detach().float())
        w._k3_fp32 = cached
    return cached[1]


def small_gemm(x: torch.Tensor, w: torch.Tensor) -> bool:
    """True where x [..., K] @ w [N, K]^T is a reduced-precision CPU GEMM that runs faster in float32: a small one
    (rows x N x K and N x K <= SMALL_GEMM_MACS), or any one with N x K <= FP32_COPY_ELEMENTS on a CPU without a
    native reduced-precision GEMM (native_reduced_gemm)."""
    if not (x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) and w.dtype == x.dtype
            and w.dim() == 2):
        return False
    if not native_reduced_gemm(x.dtype):
        return w.numel() <= FP32_COPY_ELEMENTS
    return x.numel() * w.shape[0] <= SMALL_GEMM_MACS and w.numel() <= SMALL_GEMM_MACS


def small_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ w [N, K]^T (+ bias [N]) -> [..., N] in x.dtype, computed in float32 (inputs exact in float32;
    float32 accumulation as oneDNN's bf16 GEMM does; one rounding to x.dtype at the end)."""
    b = bias.float() if bias is not None else None
    return F.linear(x.float(), float32_copy(w), b).to(x.dtype)


def attn_res_mix(prefix_sum: torch.Tensor, bank: torch.Tensor, nvb: int, cw: torch.Tensor, eps: float) -> torch.Tensor:
    """AttnRes pre-norm mixture, the math of SGLang's Triton score + combine kernels (`attn_residual._mix_fused`).

    prefix_sum [T, H]; bank [T, >= nvb, H] (the first nvb entries are live); cw [H] float32, the fused
    score_norm.weight * score_proj.weight (`attn_residual.get_cw`); eps the score norm's epsilon.
    rows = [bank[:, :nvb], prefix_sum] [T, R, H] in float32; score_r = (rows_r . cw) * rsqrt(mean(rows_r^2) + eps);
    returns sum_r softmax(score)_r * rows_r [T, H] in prefix_sum.dtype (prefix_sum itself when nvb == 0).
    """
    if nvb == 0:
        return prefix_sum
    T, H = prefix_sum.shape
    rows = torch.cat([bank[:, :nvb], prefix_sum.unsqueeze(1)], dim=1).float()  # [T, R, H]
    flat = rows.view(-1, H)  # one [T * R, H] GEMM and one norm reduction: no [T, R, H] temporaries
    ms = torch.linalg.vector_norm(flat, dim=-1).square_().div_(H)  # mean(rows_r^2)
    scores = torch.mm(flat, cw.float().view(H, 1)).view(-1).mul_(torch.rsqrt(ms.add_(eps))).view(T, -1)  # [T, R]
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs.unsqueeze(1), rows).squeeze(1).to(prefix_sum.dtype)


def flush_denormals() -> bool:
    """Flush float denormals to zero (x86 FTZ/DAZ) in this thread and the threads it starts after this call (torch's
    OpenMP workers inherit the creating thread's floating-point state); True where the CPU supports it.

    KDA's chunked prefill multiplies decays of up to 64 tokens (2^(G_i - G_j), exponents far below -126), and on x86
    every operation on a denormal result takes a microcode assist: measured on this repo's Xeons, SGLang's K3 KDA
    extend (kda_ops.kda_extend) runs about 3x faster with denormals flushed. Values below 1.2e-38 become 0, far below
    float32's resolution of the O(1) terms they are added to (the tests compare against float64 references)."""
    return bool(torch.set_flush_denormal(True))
