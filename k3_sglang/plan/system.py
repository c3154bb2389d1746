"""The hardware: GPU memory and count, how GPUs are grouped into hosts and NVLink domains.

A preset name (`gb300-nvl72`, ...) or a YAML mapping with the same fields describes a system:

    name: my-h200-pair
    gpu_name: H200
    gpu_memory_gib: 140.0      # memory visible to CUDA, per GPU
    num_gpus: 16
    gpus_per_node: 8           # GPUs per host (a tray of 4 on NVL72)
    nvlink_domain_size: 8      # GPUs sharing one NVLink fabric (72 on an NVL72 rack)
    network: infiniband        # fabric between NVLink domains: mnnvl | infiniband | roce | ethernet
    native_mxfp4: false        # Blackwell runs MXFP4 experts natively; Hopper dequantises (Marlin W4A16)
    socket_ifname: eth0        # NIC for NCCL/Gloo bootstrap (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    ib_devices: [mlx5_0, mlx5_1]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from k3_sglang.plan.fields import build_dataclass, require_bool, require_choice, require_float, require_int, require_str

NETWORKS = ("mnnvl", "infiniband", "roce", "ethernet")


@dataclass(frozen=True)
class System:
    """A set of identical GPUs: memory per GPU, hosts, NVLink domains and the network between them."""

    name: str
    gpu_name: str
    gpu_memory_gib: float
    num_gpus: int
    gpus_per_node: int
    nvlink_domain_size: int
    network: str
    native_mxfp4: bool
    socket_ifname: str | None = None
    ib_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require_str("name", self.name)
        require_str("gpu_name", self.gpu_name)
        require_float("gpu_memory_gib", self.gpu_memory_gib)
        for name in ("num_gpus", "gpus_per_node", "nvlink_domain_size"):
            require_int(name, getattr(self, name))
        require_choice("network", self.network, NETWORKS)
        require_bool("native_mxfp4", self.native_mxfp4)
        if self.socket_ifname is not None:
            require_str("socket_ifname", self.socket_ifname)
        if not isinstance(self.ib_devices, tuple) or not all(isinstance(d, str) and d for d in self.ib_devices):
            raise ValueError(f"ib_devices: expected a list of device names, got {self.ib_devices!r}")
        if self.num_gpus % self.gpus_per_node:
            raise ValueError(f"num_gpus: {self.num_gpus} is not a multiple of gpus_per_node={self.gpus_per_node}")
        if self.nvlink_domain_size % self.gpus_per_node:
            raise ValueError(f"nvlink_domain_size: {self.nvlink_domain_size} is not a multiple of "
                             f"gpus_per_node={self.gpus_per_node}")

    @property
    def num_nodes(self) -> int:
        """Hosts (trays on an NVL72 rack)."""
        return self.num_gpus // self.gpus_per_node

    @property
    def is_rack(self) -> bool:
        """True when one NVLink domain spans several hosts (NVL72): SLURM/LWS launch, MNNVL transfer."""
        return self.nvlink_domain_size > self.gpus_per_node

    def spans_domains(self, gpus: int) -> bool:
        """Whether a group of `gpus` GPUs must cross the inter-domain network."""
        return gpus > self.nvlink_domain_size

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON)."""
        return {"name": self.name, "gpu_name": self.gpu_name, "gpu_memory_gib": self.gpu_memory_gib,
                "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node,
                "nvlink_domain_size": self.nvlink_domain_size, "network": self.network,
                "native_mxfp4": self.native_mxfp4, "socket_ifname": self.socket_ifname,
                "ib_devices": list(self.ib_devices)}


# GPU memory is what CUDA reports as total per GPU (marketing "288 GB" parts report ~279 GiB).
SYSTEM_PRESETS: dict[str, System] = {
    "gb300-nvl72": System("gb300-nvl72", "GB300", 279.0, 72, 4, 72, "mnnvl", True),
    "gb200-nvl72": System("gb200-nvl72", "GB200", 185.0, 72, 4, 72, "mnnvl", True),
    "b300-8x": System("b300-8x", "B300", 270.0, 8, 8, 8, "infiniband", True),
    "h200-8x": System("h200-8x", "H200", 140.0, 8, 8, 8, "infiniband", False, "eth0"),
    "h200-16x": System("h200-16x", "H200", 140.0, 16, 8, 8, "infiniband", False, "eth0",
                       ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7")),
}


def system_from_dict(data: Any, prefix: str = "system") -> System:
    """Build a System from a mapping; a `preset` key starts from a preset and overrides its fields."""
    if isinstance(data, dict) and "preset" in data:
        base = system_preset(data["preset"]).to_dict()
        data = {**base, **{k: v for k, v in data.items() if k != "preset"}}
    return build_dataclass(System, data, prefix)


def system_preset(name: Any) -> System:
    """A named system preset; ValueError lists the known names."""
    if name not in SYSTEM_PRESETS:
        raise ValueError(f"system: unknown preset {name!r}; choose from {', '.join(SYSTEM_PRESETS)}")
    return SYSTEM_PRESETS[name]


def resolve_system(ref: Any) -> System:
    """A preset name, a path to a YAML file describing a system, or an inline mapping."""
    if isinstance(ref, dict):
        return system_from_dict(ref)
    if isinstance(ref, str) and ref.endswith((".yaml", ".yml", ".json")):
        path = Path(ref)
        if not path.is_file():
            raise ValueError(f"system: no such file {ref}")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"system: {ref} is not valid YAML ({exc})") from None
        return system_from_dict(data)
    return system_preset(ref)
