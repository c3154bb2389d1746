"""Named plans: the two deployments the launch examples are rendered from."""

from __future__ import annotations

import copy
from typing import Any

PLAN_PRESETS: dict[str, dict[str, Any]] = {
    # PP8 prefill feeding TP8/DCP8 decode over Mooncake on one GB300 NVL72 rack (18 trays of 4).
    "agent-100k": {
        "name": "agent-100k",
        "system": "gb300-nvl72",
        "model": "k3-full",
        "precision": {"kv_cache": "bf16", "kda_state": "fp32", "experts": "mxfp4"},
        "workload": {"context_length": 100_000, "output_length": 4_096, "sessions": 512},
        "serving": {"mem_fraction_static": 0.90, "mamba_full_memory_ratio": "auto"},
        "groups": [
            {"role": "prefill", "replicas": 2, "tp": 1, "pp": 8, "chunked_prefill_size": 16384},
            {"role": "decode", "replicas": 7, "tp": 8, "dcp": 8, "ep": 8},
        ],
    },
    # One TP16 server over two 8xH200 nodes; DCP8 groups stay inside a node's NVLink.
    "long-context": {
        "name": "long-context",
        "system": "h200-16x",
        "model": "k3-full",
        "precision": {"kv_cache": "bf16", "kda_state": "fp32", "experts": "mxfp4"},
        "workload": {"context_length": 262_144, "output_length": 8_192, "sessions": 16},
        "serving": {"mem_fraction_static": 0.90, "mamba_full_memory_ratio": "auto"},
        "groups": [{"role": "unified", "replicas": 1, "tp": 16, "dcp": 8, "ep": 16}],
    },
}


def plan_preset(name: str) -> dict[str, Any]:
    """A copy of a named plan's mapping; ValueError lists the known names."""
    if name not in PLAN_PRESETS:
        raise ValueError(f"preset: unknown plan preset {name!r}; choose from {', '.join(PLAN_PRESETS)}")
    return copy.deepcopy(PLAN_PRESETS[name])
