"""Which K3 implementation `k3 serve` hands to SGLang.

- SGLang's production K3 (`sglang.srt.models.kimi_k3`: TP/EP/PP, DCP, its KDA backends, MXFP4 MoE, CUDA graphs):
  the default on CUDA for real checkpoints, served with the checkpoint's own quantization config. On a CPU host
  with `K3_MODEL_IMPL=sglang` it runs on our k3_cpu platform with the CPU kernels our general plugin
  `k3_sglang_k3_cpu` plugs into SGLang's seams (k3_sglang/sglang_cpu); what it cannot serve there is refused at
  start (serving/sglang_cpu_limits.py).
- The portable model (`k3_sglang.models`, registered through SGLANG_EXTERNAL_MODEL_PACKAGE): the default on CPU;
  on CUDA for the tiny checkpoint or when `K3_MODEL_IMPL=portable`. Experts dequantised at load, kernels through
  `k3_sglang.kernels.dispatch`; what it cannot serve is refused at start (serving/portable_limits.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from k3_sglang import PORTABLE_PACKAGE  # noqa: F401 - re-exported for the serving modules


@dataclass(frozen=True)
class ServedModel:
    """The choice and why it was made (printed by `k3 serve --dry-run`)."""

    portable: bool
    reason: str

    @property
    def name(self) -> str:
        return "portable K3 (k3_sglang.models)" if self.portable else "SGLang's K3 (sglang.srt.models.kimi_k3)"


def is_tiny_config(cfg) -> bool:
    """True for the k3-tiny architecture (K3Config equal to the preset up to its name and context length)."""
    from k3_sglang.config import preset

    tiny = preset("k3-tiny")
    return dataclasses.replace(cfg, name=tiny.name, max_position_embeddings=tiny.max_position_embeddings) == tiny


def choose_model(impl: str, on_cpu: bool, tiny: bool) -> ServedModel:
    """impl: K3_MODEL_IMPL (auto | portable | sglang). Raises ValueError for a choice this host cannot run."""
    if impl == "sglang":
        if on_cpu:
            return ServedModel(False, "K3_MODEL_IMPL=sglang: SGLang's own K3 on the k3_cpu platform, CPU kernels "
                                      "plugged into its seams (k3_sglang/sglang_cpu)")
        return ServedModel(False, "K3_MODEL_IMPL=sglang")
    if impl == "portable":
        return ServedModel(True, "K3_MODEL_IMPL=portable")
    if on_cpu:
        return ServedModel(True, "no CUDA device: the portable model is the CPU default (K3_MODEL_IMPL=sglang "
                                 "serves SGLang's own K3 here)")
    if tiny:
        return ServedModel(True, "the k3-tiny checkpoint (SGLang's K3 is for real checkpoints)")
    return ServedModel(False, "CUDA device and a full checkpoint")
