"""How the GPUs are cut into serving groups: TP, DCP, PP, EP and DP-attention per group.

A group is one SGLang server (one `k3 serve` per host it spans), started `replicas` times. Roles are
`unified` (no PD) or `prefill` / `decode` (PD disaggregation; both must be present).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.fields import require_choice, require_int

ROLES = ("unified", "prefill", "decode")


@dataclass(frozen=True)
class Group:
    """One SGLang server's parallelism. GPUs = tp * pp; attention-TP = tp / dp_attention."""

    role: str = "unified"
    tp: int = 8
    dcp: int = 1
    pp: int = 1
    ep: int = 1
    dp_attention: int = 1
    replicas: int = 1
    pp_layer_partition: tuple[int, ...] | None = None
    chunked_prefill_size: int | None = None

    def __post_init__(self) -> None:
        require_choice("role", self.role, ROLES)
        for name in ("tp", "dcp", "pp", "ep", "dp_attention", "replicas"):
            require_int(name, getattr(self, name))
        if self.chunked_prefill_size is not None:
            require_int("chunked_prefill_size", self.chunked_prefill_size)
        if self.pp_layer_partition is not None:
            if not isinstance(self.pp_layer_partition, tuple):
                raise ValueError(f"pp_layer_partition: expected a list of layer counts, got {self.pp_layer_partition!r}")
            for i, n in enumerate(self.pp_layer_partition):
                require_int(f"pp_layer_partition[{i}]", n)

    @property
    def gpus(self) -> int:
        """GPUs one replica uses."""
        return self.tp * self.pp

    @property
    def attn_tp(self) -> int:
        """Attention tensor-parallel size: the ranks that shard one request's heads."""
        return self.tp // self.dp_attention

    @property
    def overlap_schedule(self) -> bool:
        """SGLang turns the overlap scheduler off under PP (which changes the KDA slots per request)."""
        return self.pp == 1

    def label(self) -> str:
        """Short human description, e.g. 'decode TP8 DCP8 EP8'."""
        parts = [self.role, f"TP{self.tp}"]
        for name, value in (("DCP", self.dcp), ("PP", self.pp), ("EP", self.ep), ("DPA", self.dp_attention)):
            if value > 1:
                parts.append(f"{name}{value}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON)."""
        data: dict[str, Any] = {"role": self.role, "replicas": self.replicas, "tp": self.tp, "dcp": self.dcp,
                                "pp": self.pp, "ep": self.ep, "dp_attention": self.dp_attention}
        if self.pp_layer_partition is not None:
            data["pp_layer_partition"] = list(self.pp_layer_partition)
        if self.chunked_prefill_size is not None:
            data["chunked_prefill_size"] = self.chunked_prefill_size
        return data


@dataclass(frozen=True)
class Topology:
    """All groups of a deployment."""

    groups: tuple[Group, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("groups: at least one group is required")
        roles = {g.role for g in self.groups}
        if "unified" in roles and roles != {"unified"}:
            raise ValueError("groups: mix of unified and prefill/decode groups; use one or the other")
        if roles in ({"prefill"}, {"decode"}):
            raise ValueError(f"groups: PD disaggregation needs both prefill and decode groups, got only {roles.pop()}")

    @property
    def disaggregated(self) -> bool:
        """True for PD (prefill and decode groups)."""
        return self.groups[0].role != "unified"

    @property
    def total_gpus(self) -> int:
        """GPUs over all replicas of all groups."""
        return sum(g.gpus * g.replicas for g in self.groups)


def stage_layer_ranges(num_layers: int, group: Group) -> tuple[range, ...]:
    """Layer ranges per PP stage: the configured partition, else SGLang's default (extra layers last)."""
    pp = group.pp
    if pp > num_layers:
        raise PlanError("pp-layers", f"pp={pp} exceeds the model's {num_layers} layers by {pp - num_layers}")
    if group.pp_layer_partition is not None:
        counts = list(group.pp_layer_partition)
        if len(counts) != pp:
            raise PlanError("pp-layers", f"pp_layer_partition has {len(counts)} entries for pp={pp} "
                            f"({'missing' if len(counts) < pp else 'extra'} {abs(pp - len(counts))})")
        if sum(counts) != num_layers:
            gap = num_layers - sum(counts)
            raise PlanError("pp-layers", f"pp_layer_partition {counts} covers {sum(counts)} layers, the model has "
                            f"{num_layers}: {abs(gap)} layer(s) {'short' if gap > 0 else 'too many'}")
    else:
        base, extra = divmod(num_layers, pp)
        counts = [base + (1 if rank >= pp - extra else 0) for rank in range(pp)]
    starts = [sum(counts[:i]) for i in range(pp)]
    return tuple(range(s, s + n) for s, n in zip(starts, counts))
