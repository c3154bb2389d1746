"""Launch settings not part of the capacity plan: paths, image, ports, scheduler options.

They come from the plan file's `launch:` section, overridden by `k3 launch render` flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from k3_sglang.plan.fields import build_dataclass, require_int, require_str

DEFAULT_MODEL_PATH = "/models/Kimi-K3"


@dataclass(frozen=True)
class LaunchSettings:
    """Where the weights are, what runs them, and the ports each server instance counts up from."""

    model_path: str = DEFAULT_MODEL_PATH
    image: str = "k3-sglang:0.1.0"
    namespace: str = "default"
    model_pvc: str = "k3-weights"
    base_port: int = 30000
    dist_init_port: int = 5000
    bootstrap_port: int = 8998
    router_port: int = 8000
    health_timeout_s: int = 1800
    slurm_time: str = "24:00:00"
    slurm_partition: str | None = None
    slurm_account: str | None = None

    def __post_init__(self) -> None:
        for name in ("model_path", "image", "namespace", "model_pvc", "slurm_time"):
            require_str(name, getattr(self, name))
        for name in ("base_port", "dist_init_port", "bootstrap_port", "router_port"):
            require_int(name, getattr(self, name), minimum=1)
            if getattr(self, name) > 65000:
                raise ValueError(f"{name}: port {getattr(self, name)} leaves no room below 65535")
        require_int("health_timeout_s", self.health_timeout_s)
        for name in ("slurm_partition", "slurm_account"):
            if getattr(self, name) is not None:
                require_str(name, getattr(self, name))

    def with_overrides(self, **overrides: Any) -> "LaunchSettings":
        """A copy with the non-None overrides applied."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


def settings_from_dict(data: Any) -> LaunchSettings:
    """Parse a plan file's `launch:` section (field names checked)."""
    return build_dataclass(LaunchSettings, data or {}, "launch")
