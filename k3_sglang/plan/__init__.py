"""Capacity planner for Kimi K3 on SGLang: weights, KV and KDA-state pools, sessions per topology.

    from k3_sglang.plan import make_plan, spec_from_dict
    result = make_plan(spec_from_dict({"system": "gb300-nvl72", "groups": [{"tp": 8, "dcp": 8, "ep": 8}]}))
"""

from k3_sglang.plan.capacity import GroupPlan, PlanResult, make_plan
from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.precision import Precision
from k3_sglang.plan.spec import PlanSpec, spec_from_dict
from k3_sglang.plan.system import SYSTEM_PRESETS, System
from k3_sglang.plan.topology import Group, Topology
from k3_sglang.plan.workload import Serving, Workload

__all__ = ["GroupPlan", "Group", "PlanError", "PlanResult", "PlanSpec", "Precision", "SYSTEM_PRESETS", "Serving",
           "System", "Topology", "Workload", "make_plan", "spec_from_dict"]
