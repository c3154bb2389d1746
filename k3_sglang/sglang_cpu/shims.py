"""The small hook functions that carry SGLang's own K3 onto a CPU host (registered by hooks.py; `small_linear` and
`rms_norm_gated` are called by the CPU layer forms of cpu_layers.py instead).

Each one wraps exactly one SGLang (or triton_kernels) function and changes behaviour only for CPU tensors, or only
for the duration of one call, so that what SGLang does around it stays SGLang's.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F


def _no_stream(*args, **kwargs):
    return None


def model_init_without_streams(original, *args, **kwargs):
    """AROUND `KimiK3LinearModel.__init__`: it builds three `torch.cuda.Stream()`s on every non-HIP build (a CUDA
    driver error here); with the constructor returning None the layers get no alt stream, the path the model
    already takes on HIP."""
    saved = torch.cuda.Stream
    torch.cuda.Stream = _no_stream
    try:
        return original(*args, **kwargs)
    finally:
        torch.cuda.Stream = saved


def upcast_mxfp4(original, tensor, scale, target_dtype, axis, *args, **kwargs):
    """AROUND triton_kernels' `upcast_from_mxfp` (SGLang's MXFP4 MoE method upcasts experts with it on a platform
    without MXFP4 kernels): for CPU uint8 codes and E8M0 scales, our MXFP4 reference decode
    (`kernels/mxfp4/naive.py`: low nibble first, 32 values per scale) along `axis`."""
    from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4

    if tensor.device.type != "cpu" or tensor.dtype != torch.uint8 or scale.dtype != torch.uint8 or args or kwargs:
        return original(tensor, scale, target_dtype, axis, *args, **kwargs)
    axis = axis % tensor.ndim
    t, s = tensor.movedim(axis, -1), scale.movedim(axis, -1)
    out = dequant_mxfp4(t.reshape(-1, t.shape[-1]).contiguous(), s.reshape(-1, s.shape[-1]).contiguous(),
                        target_dtype)
    return out.view(*t.shape[:-1], 2 * t.shape[-1]).movedim(-1, axis).contiguous()


def small_linear(original, self, layer, x, bias=None):
    """`K3CpuLinearMethod.apply` (cpu_layers.py; every unquantized linear layer of SGLang's K3, `original` SGLang's
    `UnquantizedLinearMethod.apply`): a small bf16/fp16 GEMM
    on CPU (decode-sized: rows x N x K <= fast_ops.SMALL_GEMM_MACS), or any size on a CPU without a native bf16/fp16
    GEMM (fast_ops.native_reduced_gemm), runs in float32 against a cached float32 copy of the weight
    (fast_ops.small_linear: ~3x less time than oneDNN's reduced-precision GEMM at decode size, 10-15x less than the
    fallback GEMM of an AVX2-only CPU); every other call, SGLang's own path."""
    from k3_sglang.sglang_cpu import fast_ops

    weight = getattr(layer, "weight", None)
    if isinstance(weight, torch.Tensor) and fast_ops.small_gemm(x, weight):
        return fast_ops.small_linear(x, weight, bias)
    return original(self, layer, x, bias)


def rms_norm_gated(original, self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """`K3CpuFusedRMSNormGated.forward` (cpu_layers.py; KDA's output norm, a Triton kernel, `original` SGLang's
    forward): for CPU tensors RMSNorm over the
    last dim in float32, times the weight, times sigmoid(g) ("sigmoid", K3) or silu(g) ("swish"/"silu")."""
    if x.device.type != "cpu" or residual is not None or prenorm:
        return original(self, x, g, residual, prenorm, residual_in_fp32)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
    if self.weight is not None:
        y = y * self.weight.float()
    gf = g.float()
    y = y * (torch.sigmoid(gf) if self.activation == "sigmoid" else F.silu(gf))
    return y.to(x.dtype)


def attn_res_mix(original, prefix_sum, bank, nvb, score_proj, score_norm):
    """AROUND `attn_residual._mix_fused` (the AttnRes score + combine kernels). For CPU tensors the same math in
    torch (fast_ops.attn_res_mix: scores from SGLang's fused weight `get_cw`, float32 like the kernels), falling back
    to SGLang's eager `aggregate_stream_torch` where the score projection has a bias or the norm a variance override;
    off CPU, the eager path for a hidden size that is not a multiple of the combine kernel's 1024-wide block (its grid
    would have zero blocks and leave the output unwritten: docs/sglang-bugs.md)."""
    from sglang.srt.layers import attn_residual

    if prefix_sum.device.type == "cpu":
        if getattr(score_proj, "bias", None) is None and getattr(score_norm, "variance_size_override", None) is None:
            from k3_sglang.sglang_cpu.fast_ops import attn_res_mix as mix

            cw = attn_residual.get_cw(score_proj, score_norm)
            return mix(prefix_sum, bank, nvb, cw, score_norm.variance_epsilon)
        return attn_residual.aggregate_stream_torch(prefix_sum, bank, nvb, score_proj, score_norm)
    if prefix_sum.shape[1] % attn_residual._BLOCK_H:
        return attn_residual.aggregate_stream_torch(prefix_sum, bank, nvb, score_proj, score_norm)
    return original(prefix_sum, bank, nvb, score_proj, score_norm)


def no_fused_triton_moe(original, *args):
    """AROUND `FusedOpPool.get_fused_func(a2a, runner)`: no fused function for the "triton" runner, so
    `MoeRunner.run` calls the runner core registered for that name (moe_runner.K3CpuMoeRunnerCore)."""
    if args[-1] == "triton":
        return None
    return original(*args)


def conv1d_fn(*args, **kwargs):
    """REPLACE of `kda_backend.causal_conv1d_fn` (a Triton kernel): kda_ops.causal_conv1d_fn."""
    from k3_sglang.sglang_cpu.kda_ops import causal_conv1d_fn

    return causal_conv1d_fn(*args, **kwargs)


def conv1d_update(*args, **kwargs):
    """REPLACE of `kda_backend.causal_conv1d_update` (a Triton kernel): kda_ops.causal_conv1d_update."""
    from k3_sglang.sglang_cpu.kda_ops import causal_conv1d_update

    return causal_conv1d_update(*args, **kwargs)


def kda_dispatcher_on_cpu(original, self, *args, **kwargs):
    """AROUND `KDAKernelDispatcher.__init__`: SGLang builds its dispatcher (Triton kernel for the triton backends),
    then every role is handed our torch kernel (kda_kernel.K3CpuKDAKernel)."""
    original(self, *args, **kwargs)
    from k3_sglang.sglang_cpu.kda_kernel import K3CpuKDAKernel

    kernel = K3CpuKDAKernel()
    self.triton_kernel = self.decode_kernel = self.verify_kernel = self.extend_kernel = kernel
    self.supports_packed_decode = self.supports_packed_decode_safe_gate = False
    logging.getLogger(__name__).info("KDA kernel dispatcher on k3_cpu: decode, verify and extend run %s",
                                     type(kernel).__name__)


def last_loc_on_cpu(original, req_to_token, req_pool_indices, prefix_lens):
    """AROUND `mem_cache.allocation.get_last_loc` (each request's last KV slot before a paged allocation): with any
    attention backend but torch_native SGLang launches a Triton kernel, which has no CPU driver. Speculative decode
    at a page size above 1 (K3_CSV under DCP, whose allocator page is page_size x dcp_size) reaches it; for CPU
    tensors SGLang's own `get_last_loc_torch` answers (same values: prefix_lens [B] -> req_to_token[idx, len - 1],
    -1 where len is 0)."""
    if req_to_token.is_cpu:
        from sglang.srt.mem_cache.allocation import get_last_loc_torch

        return get_last_loc_torch(req_to_token, req_pool_indices, prefix_lens)
    return original(req_to_token, req_pool_indices, prefix_lens)
