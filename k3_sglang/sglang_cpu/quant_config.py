"""The k3_cpu platform's compressed-tensors config: SGLang's `CompressedTensorsConfig` that also accepts float32
activations.

SGLang looks a quantization method up through the platform's public `SRTPlatform.get_quantization_config` on an
out-of-tree platform (layers/quantization `get_quantization_config`) and checks the model's dtype against the
config's `get_supported_act_dtypes()` when it loads (model_loader/loader.py). In-tree that list is float16 and
bfloat16; on CPU every op runs in float32 and the float32 model (the exact tests) must load the checkpoint's
compressed-tensors MXFP4 experts, whose upcast weights (exact in bf16) are read in the activation dtype
(moe_runner.py). Nothing else about the config changes.
"""
from __future__ import annotations

import torch
from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

METHOD = "compressed-tensors"


class K3CpuCompressedTensorsConfig(CompressedTensorsConfig):
    """SGLang's compressed-tensors config with float32 among the supported activation dtypes."""

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        """SGLang's list (float16, bfloat16 in 0.5.23), then float32 when it is not already there."""
        supported = list(super().get_supported_act_dtypes())
        return supported + ([torch.float32] if torch.float32 not in supported else [])
