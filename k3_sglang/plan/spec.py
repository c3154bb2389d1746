"""A complete plan input (PlanSpec) and its YAML/JSON form.

    name: agent-100k
    system: gb300-nvl72              # preset name, path to a system YAML, or an inline mapping
    model: k3-full                   # K3 preset name or a path to a config.json
    precision: {kv_cache: bf16, kda_state: fp32, experts: mxfp4}
    workload: {context_length: 100000, output_length: 4096, sessions: 256}
    serving: {mem_fraction_static: 0.9, mamba_full_memory_ratio: auto}
    groups:
      - {role: prefill, replicas: 2, tp: 1, pp: 8, chunked_prefill_size: 16384}
      - {role: decode, replicas: 7, tp: 8, dcp: 8, ep: 8}
    launch: {...}                    # read only by `k3 launch render`

`k3 plan --json` output ({"spec": ..., "result": ...}) loads too: the spec is used, the result recomputed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from k3_sglang.config import K3Config, preset
from k3_sglang.plan.fields import build_dataclass, require_mapping, require_str
from k3_sglang.plan.precision import Precision
from k3_sglang.plan.system import System, resolve_system
from k3_sglang.plan.topology import Group, Topology
from k3_sglang.plan.workload import Serving, Workload

TOP_LEVEL_KEYS = ("name", "system", "model", "precision", "workload", "serving", "groups", "launch")


@dataclass(frozen=True)
class PlanSpec:
    """Everything the planner needs: system, model, precisions, topology, workload, SGLang knobs."""

    system: System
    topology: Topology
    model: str = "k3-full"
    precision: Precision = field(default_factory=Precision)
    workload: Workload = field(default_factory=Workload)
    serving: Serving = field(default_factory=Serving)
    name: str = "custom"

    def load_model(self) -> K3Config:
        """The K3Config named by `model` (a preset or a config.json path)."""
        return load_model(self.model)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form; `spec_from_dict(spec.to_dict()) == spec`."""
        return {"name": self.name, "system": self.system.to_dict(), "model": self.model,
                "precision": self.precision.to_dict(), "workload": self.workload.to_dict(),
                "serving": self.serving.to_dict(), "groups": [g.to_dict() for g in self.topology.groups]}


def load_model(ref: str) -> K3Config:
    """A K3 preset name, or a path to a config.json (or the folder holding one)."""
    require_str("model", ref)
    if Path(ref).exists():
        return K3Config.from_json(ref)
    try:
        return preset(ref)
    except ValueError as exc:
        raise ValueError(f"model: {exc}") from None


def groups_from_list(data: Any) -> Topology:
    """Topology from the `groups` list."""
    if not isinstance(data, list) or not data:
        raise ValueError(f"groups: expected a non-empty list of groups, got {data!r}")
    groups = tuple(build_dataclass(Group, g, f"groups[{i}]") for i, g in enumerate(data))
    try:
        return Topology(groups)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def spec_from_dict(data: Any) -> PlanSpec:
    """Parse and type-check a plan mapping; errors name the offending field."""
    data = require_mapping("plan", data)
    if "spec" in data and "result" in data:  # `k3 plan --json` output
        data = require_mapping("spec", data["spec"])
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown top-level field; known fields are {', '.join(TOP_LEVEL_KEYS)}")
    for key in ("system", "groups"):
        if key not in data:
            raise ValueError(f"{key}: missing")
    return PlanSpec(
        name=require_str("name", data.get("name", "custom")),
        system=resolve_system(data["system"]),
        model=data.get("model", "k3-full"),
        precision=build_dataclass(Precision, data.get("precision", {}), "precision"),
        workload=build_dataclass(Workload, data.get("workload", {}), "workload"),
        serving=build_dataclass(Serving, data.get("serving", {}), "serving"),
        topology=groups_from_list(data["groups"]),
    )


def read_plan_document(path: str | Path) -> dict:
    """The raw mapping of a plan file (YAML or JSON)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"plan: no such file {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"plan: {path} is not valid YAML/JSON ({exc})") from None
    data = require_mapping("plan", data)
    return data.get("spec", data) if "result" in data else data


def dump_plan_yaml(spec: PlanSpec, launch: dict | None = None) -> str:
    """The YAML text `k3 plan --save` writes (and `k3 launch render` reads)."""
    data = spec.to_dict()
    if launch:
        data["launch"] = launch
    return yaml.safe_dump(data, sort_keys=False)


def dump_json(data: Any) -> str:
    """Stable, indented JSON."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
