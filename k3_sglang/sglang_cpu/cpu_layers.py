"""CPU forms of two SGLang layer pieces, adopted by the k3_cpu platform's `post_load_model` (SGLang's public seam
after the weights load, "the place to ... swap quant methods, or install forward hooks on an in-tree model class"):

- each `UnquantizedLinearMethod` of the model becomes `K3CpuLinearMethod`: a small bf16/fp16 GEMM on CPU (or any size
  on a CPU without a native reduced-precision GEMM) runs in float32 (shims.small_linear);
- each `FusedRMSNormGated` (KDA's output norm, a Triton kernel) becomes `K3CpuFusedRMSNormGated`: the same math in
  torch for CPU tensors (shims.rms_norm_gated).
Both are subclasses that change only what CPU tensors do; the objects keep their state (their class is swapped in
place), and nothing outside this one model changes.
"""
from __future__ import annotations

import logging

from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

from k3_sglang.sglang_cpu import shims

log = logging.getLogger(__name__)


class K3CpuLinearMethod(UnquantizedLinearMethod):
    """SGLang's unquantized linear method; x [T, K] @ weight [N, K]^T in float32 where shims.small_linear says so."""

    def apply(self, layer, x, bias=None):
        return shims.small_linear(UnquantizedLinearMethod.apply, self, layer, x, bias)


class K3CpuFusedRMSNormGated(FusedRMSNormGated):
    """SGLang's gated RMSNorm; x [T, D], g [T, D] -> [T, D] in torch for CPU tensors."""

    def forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
        return shims.rms_norm_gated(FusedRMSNormGated.forward, self, x, g, residual, prenorm, residual_in_fp32)


def adopt(model) -> dict[str, int]:
    """Swap, in place, the class of every exact UnquantizedLinearMethod and FusedRMSNormGated in `model` for its CPU
    form; returns how many of each."""
    counts = {"linear": 0, "gated_norm": 0}
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if type(method) is UnquantizedLinearMethod:
            method.__class__ = K3CpuLinearMethod
            counts["linear"] += 1
        if type(module) is FusedRMSNormGated:
            module.__class__ = K3CpuFusedRMSNormGated
            counts["gated_norm"] += 1
    log.info("k3_cpu: %d unquantized linears and %d gated norms take their CPU forms", counts["linear"],
             counts["gated_norm"])
    return counts
