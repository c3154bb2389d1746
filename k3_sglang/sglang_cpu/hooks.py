"""SGLang general plugin `k3_sglang_k3_cpu`: what SGLang's own K3 needs on the k3_cpu platform (exploration)."""
from __future__ import annotations

import os


def active() -> bool:
    from k3_sglang.platform import PLATFORM_NAME
    from k3_sglang.serving.model_choice import PORTABLE_PACKAGE

    return (os.environ.get("SGLANG_PLATFORM") == PLATFORM_NAME
            and os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE") != PORTABLE_PACKAGE)


def _no_stream(*args, **kwargs):
    return None


def model_init_without_streams(original, *args, **kwargs):
    import torch

    saved = torch.cuda.Stream
    torch.cuda.Stream = _no_stream
    try:
        return original(*args, **kwargs)
    finally:
        torch.cuda.Stream = saved


def upcast_mxfp4(original, tensor, scale, target_dtype, axis, *args, **kwargs):
    import torch
    from k3_sglang.kernels.mxfp4.naive import dequant_mxfp4

    if tensor.device.type != "cpu" or tensor.dtype != torch.uint8 or scale.dtype != torch.uint8 or args or kwargs:
        return original(tensor, scale, target_dtype, axis, *args, **kwargs)
    axis = axis % tensor.ndim
    t = tensor.movedim(axis, -1)
    s = scale.movedim(axis, -1)
    out = dequant_mxfp4(t.reshape(-1, t.shape[-1]).contiguous(), s.reshape(-1, s.shape[-1]).contiguous(), target_dtype)
    return out.view(*t.shape[:-1], 2 * t.shape[-1]).movedim(-1, axis).contiguous()


def kda_dispatcher_on_cpu(original, self, *args, **kwargs):
    original(self, *args, **kwargs)
    from k3_sglang.sglang_cpu.kda_kernel import K3CpuKDAKernel

    kernel = K3CpuKDAKernel()
    self.triton_kernel = self.decode_kernel = self.verify_kernel = self.extend_kernel = kernel
    self.supports_packed_decode = self.supports_packed_decode_safe_gate = False


def conv_fn(*args, **kwargs):
    from k3_sglang.sglang_cpu.kda_ops import causal_conv1d_fn

    return causal_conv1d_fn(*args, **kwargs)


def conv_update(*args, **kwargs):
    from k3_sglang.sglang_cpu.kda_ops import causal_conv1d_update

    return causal_conv1d_update(*args, **kwargs)


def rms_norm_gated(original, self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    import torch
    import torch.nn.functional as F

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
    from sglang.srt.layers import attn_residual

    if prefix_sum.device.type == "cpu" or prefix_sum.shape[1] % attn_residual._BLOCK_H:
        return attn_residual.aggregate_stream_torch(prefix_sum, bank, nvb, score_proj, score_norm)
    return original(prefix_sum, bank, nvb, score_proj, score_norm)


def no_fused_triton_moe(original, *args):
    if args[-1] == "triton":
        return None  # the runner core (moe_runner.K3CpuMoeRunnerCore) runs instead
    return original(*args)


def float32_activations(result, *args, **kwargs):
    import torch

    return list(result) + ([torch.float32] if torch.float32 not in result else [])


def installed_hooks():
    return [("sglang.srt.models.kimi_k3.KimiK3LinearModel.__init__", model_init_without_streams, "AROUND"),
            ("triton_kernels.numerics_details.mxfp.upcast_from_mxfp", upcast_mxfp4, "AROUND"),
            ("sglang.srt.layers.attention.linear.kda_backend.KDAKernelDispatcher.__init__", kda_dispatcher_on_cpu, "AROUND"),
            ("sglang.srt.layers.attention.linear.kda_backend.causal_conv1d_fn", conv_fn, "REPLACE"),
            ("sglang.srt.layers.attention.linear.kda_backend.causal_conv1d_update", conv_update, "REPLACE"),
            ("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward", rms_norm_gated, "AROUND"),
            ("sglang.srt.layers.attn_residual._mix_fused", attn_res_mix, "AROUND"),
            ("sglang.srt.layers.moe.moe_runner.base.FusedOpPool.get_fused_func", no_fused_triton_moe, "AROUND"),
            ("sglang.srt.layers.quantization.compressed_tensors.compressed_tensors.CompressedTensorsConfig.get_supported_act_dtypes", float32_activations, "AFTER")]


def register() -> None:
    if not active():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in installed_hooks():
        HookRegistry.register(target, hook, HookType[kind])
    from k3_sglang.sglang_cpu import mla_backend

    mla_backend.register()
    from k3_sglang.sglang_cpu import moe_runner

    moe_runner.register()
