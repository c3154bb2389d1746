"""Storage precisions: the MLA KV cache, the KDA recurrent state and the routed experts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k3_sglang.plan.fields import require_choice

# name -> (bytes per element, SGLang flag value)
KV_CACHE_DTYPES = {"bf16": (2, "bf16"), "fp8_e4m3": (1, "fp8_e4m3")}
KDA_STATE_DTYPES = {"fp32": (4, "float32"), "bf16": (2, "bfloat16")}
EXPERT_FORMATS = ("mxfp4", "bf16")
CONV_STATE_BYTES = 2  # SGLang keeps the KDA short-conv windows in bf16 whatever the SSM dtype


@dataclass(frozen=True)
class Precision:
    """KV cache dtype (bf16 | fp8_e4m3), KDA state dtype (fp32 | bf16), experts (mxfp4 | bf16 dequantised)."""

    kv_cache: str = "bf16"
    kda_state: str = "fp32"
    experts: str = "mxfp4"

    def __post_init__(self) -> None:
        require_choice("kv_cache", self.kv_cache, KV_CACHE_DTYPES)
        require_choice("kda_state", self.kda_state, KDA_STATE_DTYPES)
        require_choice("experts", self.experts, EXPERT_FORMATS)

    @property
    def kv_bytes(self) -> int:
        """Bytes per element of the MLA latent cache."""
        return KV_CACHE_DTYPES[self.kv_cache][0]

    @property
    def ssm_bytes(self) -> int:
        """Bytes per element of the KDA recurrent state."""
        return KDA_STATE_DTYPES[self.kda_state][0]

    @property
    def kv_cache_flag(self) -> str:
        """Value for SGLang's --kv-cache-dtype."""
        return KV_CACHE_DTYPES[self.kv_cache][1]

    @property
    def ssm_dtype_flag(self) -> str:
        """Value for SGLang's --mamba-ssm-dtype."""
        return KDA_STATE_DTYPES[self.kda_state][1]

    @property
    def experts_mxfp4(self) -> bool:
        """Routed experts stay 4-bit in memory (native on Blackwell, Marlin-dequantised on Hopper)."""
        return self.experts == "mxfp4"

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON)."""
        return {"kv_cache": self.kv_cache, "kda_state": self.kda_state, "experts": self.experts}
