"""Where each server instance runs: hosts, GPU offset and ports, assigned in plan order."""

from __future__ import annotations

from dataclasses import dataclass

from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.capacity import GroupPlan, PlanResult
from k3_sglang.plan.topology import Group


@dataclass(frozen=True)
class Instance:
    """One replica of one group: a single SGLang server spanning `nnodes` hosts."""

    name: str
    plan: GroupPlan
    index: int
    first_node: int
    nnodes: int
    gpus_per_node: int
    base_gpu_id: int
    port: int
    dist_init_port: int
    bootstrap_port: int

    @property
    def group(self) -> Group:
        """The group this instance is a replica of."""
        return self.plan.group

    @property
    def nodes(self) -> range:
        """Host indices, node rank order."""
        return range(self.first_node, self.first_node + self.nnodes)


def group_names(result: PlanResult) -> list[str]:
    """`prefill`, `decode`, `unified` — with the group index appended when a role repeats."""
    roles = [g.group.role for g in result.groups]
    return [role if roles.count(role) == 1 else f"{role}{i}" for i, role in enumerate(roles)]


def place_instances(result: PlanResult, settings: LaunchSettings) -> list[Instance]:
    """Lay every replica onto consecutive GPUs; a multi-host group starts on a host boundary."""
    per_node = result.spec.system.gpus_per_node
    instances, next_gpu = [], 0
    for name, plan in zip(group_names(result), result.groups):
        gpus = plan.group.gpus
        for replica in range(plan.group.replicas):
            if gpus >= per_node and next_gpu % per_node:
                next_gpu += per_node - next_gpu % per_node
            index = len(instances)
            instances.append(Instance(
                name=f"{name}-{replica}", plan=plan, index=index, first_node=next_gpu // per_node,
                nnodes=max(1, gpus // per_node), gpus_per_node=min(gpus, per_node),
                base_gpu_id=next_gpu % per_node, port=settings.base_port + index,
                dist_init_port=settings.dist_init_port + index, bootstrap_port=settings.bootstrap_port + index))
            next_gpu += gpus
    return instances


def nodes_used(instances: list[Instance]) -> int:
    """Hosts the layout occupies."""
    return max(i.first_node + i.nnodes for i in instances)
