"""Structural checks of a topology against the model and the system; each failure is a PlanError
naming the constraint and the size of the violation."""

from __future__ import annotations

from k3_sglang.config import K3Config
from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.system import System
from k3_sglang.plan.topology import Group, Topology, stage_layer_ranges


def _divides(constraint: str, divisor_name: str, divisor: int, target_name: str, target: int) -> None:
    if target % divisor:
        raise PlanError(constraint, f"{divisor_name}={divisor} does not divide {target_name}={target} "
                        f"({target} % {divisor} = {target % divisor}; nearest valid: "
                        f"{', '.join(str(d) for d in _nearest_divisors(target, divisor))})")


def _nearest_divisors(n: int, near: int) -> list[int]:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    below = [d for d in divisors if d < near][-1:]
    above = [d for d in divisors if d > near][:1]
    return below + above


def check_parallel_sizes(group: Group, model: K3Config) -> None:
    """TP / DP-attention / DCP / EP / heads / PP rules SGLang enforces for one group."""
    where = f"{group.role} group"
    _divides("dp-attention", f"{where}: dp_attention", group.dp_attention, "tp", group.tp)
    if group.attn_tp % group.dcp:
        raise PlanError("dcp-divides-attn-tp", f"{where}: dcp={group.dcp} does not divide the attention-TP size "
                        f"{group.attn_tp} (tp {group.tp} / dp_attention {group.dp_attention}): "
                        f"{group.attn_tp} % {group.dcp} = {group.attn_tp % group.dcp}")
    _divides("ep-divides-tp", f"{where}: ep", group.ep, "tp", group.tp)
    _divides("ep-divides-experts", f"{where}: ep", group.ep, "num_experts", model.moe.num_experts)
    _divides("heads-divisible", f"{where}: attention-TP", group.attn_tp, "KDA num_heads", model.kda.num_heads)
    _divides("heads-divisible", f"{where}: attention-TP", group.attn_tp, "MLA num_heads", model.mla.num_heads)
    stage_layer_ranges(model.num_layers, group)


def check_placement(group: Group, system: System) -> None:
    """A group fills whole hosts, or a divisor of one host's GPUs."""
    gpus, per_node = group.gpus, system.gpus_per_node
    if gpus <= per_node and per_node % gpus == 0:
        return
    if gpus > per_node and gpus % per_node == 0:
        return
    raise PlanError("group-placement", f"{group.role} group needs {gpus} GPUs, which neither divides nor is a "
                    f"multiple of the {per_node} GPUs per {system.name} host "
                    f"(next valid size: {-(-gpus // per_node) * per_node})")


def check_pd_dcp(topology: Topology) -> None:
    """PD KV transfer: prefill DCP is 1 (token relayout) or equal to the decode DCP (page path)."""
    if not topology.disaggregated:
        return
    decode_dcps = {g.dcp for g in topology.groups if g.role == "decode"}
    for g in topology.groups:
        if g.role == "prefill" and g.dcp != 1 and decode_dcps != {g.dcp}:
            raise PlanError("pd-dcp", f"prefill dcp={g.dcp} must be 1 or equal to the decode dcp "
                            f"{sorted(decode_dcps)}; SGLang rejects other DCP transitions")


def check_topology(topology: Topology, model: K3Config, system: System) -> None:
    """All structural constraints; the memory constraints are checked while sizing the pools."""
    for group in topology.groups:
        check_parallel_sizes(group, model)
        check_placement(group, system)
    check_pd_dcp(topology)
    need = topology.total_gpus
    if need > system.num_gpus:
        raise PlanError("gpu-count", f"the topology needs {need} GPUs, {system.name} has {system.num_gpus}: "
                        f"short by {need - system.num_gpus}")
