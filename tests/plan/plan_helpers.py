"""Small builders shared by the planner tests."""

from __future__ import annotations

from typing import Any

from k3_sglang.plan import PlanResult, make_plan, spec_from_dict


def spec_for(system: str = "gb300-nvl72", groups: list[dict] | None = None, **sections: Any):
    """A PlanSpec from a system preset, groups (default one TP8 group) and section overrides."""
    doc: dict[str, Any] = {"system": system, "groups": groups or [{"tp": 8, "ep": 8}]}
    doc.update(sections)
    return spec_from_dict(doc)


def plan_for(system: str = "gb300-nvl72", groups: list[dict] | None = None, **sections: Any) -> PlanResult:
    """make_plan(spec_for(...))."""
    return make_plan(spec_for(system, groups, **sections))
