"""The `K3CpuPlatform` class (imported by SGLang only when the k3_cpu platform is selected)."""

from __future__ import annotations

import torch
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform


class K3CpuPlatform(CpuDeviceMixin, SRTPlatform):
    """Real SGLang on CPU: torch_native attention, gloo collectives, no graphs, no pinning."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    capabilities = PlatformCapabilities()

    def get_device(self, device_id: int = 0) -> str:  # type: ignore[override]
        # SGLang's serving hook calls .split(":") on this value: it must be a str.
        return "cpu"

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "torch_native"

    def get_graph_runner_cls(self):
        return None

    def get_dispatch_key_name(self) -> str:
        return "native"

    def get_torch_distributed_backend_str(self) -> str:
        return "gloo"

    def get_group_coordinator_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    def is_pin_memory_available(self, device=None) -> bool:
        return False

    def get_kv_pool_cls(self, *, kind):
        """SGLang's MLA pool with a torch row read on CPU (sglang_cpu/mla_pool.py); the in-tree class otherwise."""
        if kind == "mla":
            from k3_sglang.sglang_cpu.mla_pool import K3CpuMLATokenToKVPool

            return K3CpuMLATokenToKVPool
        return None

    def get_quantization_config(self, quantization: str):
        """SGLang's compressed-tensors config accepting float32 activations (sglang_cpu/quant_config.py); SGLang's
        own config for every other method."""
        from k3_sglang.sglang_cpu.quant_config import METHOD, K3CpuCompressedTensorsConfig

        return K3CpuCompressedTensorsConfig if quantization == METHOD else None

    def post_load_model(self, model) -> None:
        """SGLang's seam after the weights load: the CPU forms of its unquantized linear method and gated RMSNorm
        (sglang_cpu/cpu_layers.py)."""
        from k3_sglang.sglang_cpu.cpu_layers import adopt

        adopt(model)

    def support_mamba_cache_extra_buffer(self) -> bool:
        # SGLang's KDA backend writes its track-slot snapshots (the decode-time tracking in torch:
        # dcp_mla/cpu_kernels.py); the scheduler's one pinned copy on that path is made pageable by platform_hooks (3).
        return True
