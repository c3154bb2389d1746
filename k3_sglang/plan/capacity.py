"""The planner: per group, size every PP stage's pools and count the sessions each group holds.

Per attention (DP) rank, under DCP size c:
    logical KV tokens = physical tokens * c
    sessions by KV    = logical tokens // (session tokens rounded up to a page of page_size * c)
    sessions by state = state slots // (S + D)
A group holds dp_attention * min(...) sessions, capped by max_running_requests; the smallest ceiling
over the stages is the binding one, and its name says which pool to grow.

Cached (paused) sessions, held by the radix tree between turns (plan/sessions.py), need no running slots: on
device min(logical tokens // session tokens, state slots // P) per DP rank, P = states per cached session; on the
HiCache host tier the host budget split between latent rows and P KDA states in the session's proportion.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3_sglang.config import K3Config
from k3_sglang.plan.attention import attention_backend
from k3_sglang.plan.constraints import check_topology
from k3_sglang.plan.sessions import (DEFAULT_PREFILL_CHUNK, CachedSessions, HostSplit, device_cached_sessions,
                                     host_split, states_per_cached_session)
from k3_sglang.plan.memory import StageMemory, balanced_ratio, solved_ratio, stage_memory, state_bytes_per_slot, \
    kv_bytes_per_token
from k3_sglang.plan.spec import PlanSpec
from k3_sglang.plan.topology import Group, stage_layer_ranges
from k3_sglang.plan.units import from_gib
from k3_sglang.plan.weights import checkpoint_bytes

KV_CEILING = "mla-kv-pool"
STATE_CEILING = "kda-state-slots"
RUNNING_CEILING = "max-running-requests"


@dataclass(frozen=True)
class StageCapacity:
    """Sessions one stage's pools allow for the whole group (all DP ranks)."""

    memory: StageMemory
    logical_kv_tokens: int | None
    sessions_by_kv: int | None
    sessions_by_state: int | None

    @property
    def sessions(self) -> int:
        """The smaller of the two pool ceilings."""
        return min(v for v in (self.sessions_by_kv, self.sessions_by_state) if v is not None)


@dataclass(frozen=True)
class GroupPlan:
    """The capacity of one group (per replica), at its binding PP stage."""

    group: Group
    stages: tuple[StageCapacity, ...]
    binding_stage: int
    slots_per_request: int
    balanced_ratio: float
    sessions: int
    binding: str
    notes: tuple[str, ...]
    states_per_session: int = 1
    cached_device: CachedSessions | None = None  # paused sessions the device pools keep (whole group)
    host: HostSplit | None = None  # the HiCache host tier of one rank at the binding stage (None: no host tier)
    cached_host: int | None = None  # paused sessions the host tier keeps (whole group)
    attention_backend: str | None = None  # the --attention-backend its servers get (None: SGLang decides)

    @property
    def bound(self) -> StageCapacity:
        """The stage whose pools bind."""
        return self.stages[self.binding_stage]

    @property
    def serves_sessions(self) -> bool:
        """Decode and unified groups hold sessions; prefill groups hold in-flight prefills."""
        return self.group.role != "prefill"


@dataclass(frozen=True)
class PlanResult:
    """A sized deployment."""

    spec: PlanSpec
    model: K3Config
    checkpoint_bytes: int
    groups: tuple[GroupPlan, ...]

    @property
    def total_sessions(self) -> int:
        """Concurrent sessions over all decode/unified replicas."""
        return sum(g.sessions * g.group.replicas for g in self.groups if g.serves_sessions)

    @property
    def meets_target(self) -> bool:
        """Whether the deployment holds the workload's sessions."""
        return self.total_sessions >= self.spec.workload.sessions


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def stage_capacity(memory: StageMemory, group: Group, spec: PlanSpec, slots_per_request: int) -> StageCapacity:
    """Group-wide ceilings of one stage."""
    dp = group.dp_attention
    per_session = _round_up(spec.workload.session_tokens, spec.serving.page_size * group.dcp)
    logical = None if memory.kv_tokens is None else memory.kv_tokens * group.dcp
    by_kv = None if logical is None else dp * (logical // per_session)
    by_state = None if memory.state_slots is None else dp * (memory.state_slots // slots_per_request)
    return StageCapacity(memory, None if logical is None else dp * logical, by_kv, by_state)


def group_balanced_ratio(model: K3Config, group: Group, spec: PlanSpec, slots_per_request: int) -> float:
    """r* for this group from whole-model per-rank state and KV sizes."""
    layers = range(model.num_layers)
    return balanced_ratio(state_bytes_per_slot(model, layers, group, spec.precision),
                          kv_bytes_per_token(model, layers, spec.precision), slots_per_request,
                          spec.serving.draft_tokens, group.dcp, spec.workload.session_tokens)


def _binding(stage: StageCapacity, cap: int | None) -> tuple[int, str]:
    candidates = [(v, name) for v, name in ((stage.sessions_by_state, STATE_CEILING),
                                            (stage.sessions_by_kv, KV_CEILING), (cap, RUNNING_CEILING))
                  if v is not None]
    return min(candidates, key=lambda c: c[0])


def _notes(group: Group, spec: PlanSpec) -> tuple[str, ...]:
    notes = []
    system = spec.system
    if system.spans_domains(group.gpus):
        notes.append(f"TP{group.tp} spans {-(-group.gpus // system.nvlink_domain_size)} NVLink domains "
                     f"over {system.network}")
    if not system.native_mxfp4 and spec.precision.experts_mxfp4:
        notes.append("MXFP4 experts run on the Marlin W4A16 path (dequantised per MAC): memory win kept, FLOP win lost")
    if group.dcp > 1 and spec.serving.draft_tokens:
        notes.append("DCP saves target MLA KV only; draft KV and KDA state are not DCP-sharded")
    if group.dcp > 1 and not system.native_mxfp4 and spec.serving.attention_backend in ("auto", "k3_dcp_mla"):
        notes.append("DCP off Blackwell runs on the k3_dcp_mla attention backend (Triton, eager decode: no CUDA "
                     "graphs); SGLang 0.5.23's own K3 DCP needs cutedsl_mla (SM100)")
    return tuple(notes)


def cached_sessions(stages: tuple[StageCapacity, ...], group: Group, spec: PlanSpec, states: int) -> CachedSessions | None:
    """Paused sessions the group's device pools keep, at the stage that holds fewest (None: no KV or no state)."""
    dp, per_stage = group.dp_attention, []
    for stage in stages:
        m = stage.memory
        if stage.logical_kv_tokens is None or m.state_slots is None:
            return None
        c = device_cached_sessions(m.kv_tokens * group.dcp, m.state_slots, spec.workload.session_tokens, states,
                                   spec.serving.page_size * group.dcp)
        per_stage.append(CachedSessions(dp * c.by_kv, dp * c.by_state))
    return min(per_stage, key=lambda c: c.sessions)


def host_tier(stages: tuple[StageCapacity, ...], group: Group, spec: PlanSpec, states: int) -> HostSplit | None:
    """One rank's HiCache host split at the stage that holds fewest sessions (None: no host tier). Raises PlanError
    when the host tier cannot hold one session of the workload."""
    host_gib = float(spec.serving.hicache_host_gib)
    if host_gib <= 0:
        return None
    splits = [host_split(from_gib(host_gib), spec.workload.session_tokens, s.memory.kv_bytes_per_token,
                         s.memory.state_bytes_per_slot, states, group.dcp) for s in stages]
    return min(splits, key=lambda h: h.sessions)


def plan_group(model: K3Config, group: Group, spec: PlanSpec) -> GroupPlan:
    """Size one group: every PP stage, under the configured or the balanced state/KV ratio."""
    slots = spec.serving.state_slots_per_request(group.overlap_schedule, group.role)
    exact = group_balanced_ratio(model, group, spec, slots)
    ratio = solved_ratio(exact) if spec.serving.auto_ratio else float(spec.serving.mamba_full_memory_ratio)
    ranges = stage_layer_ranges(model.num_layers, group)
    stages = tuple(
        stage_capacity(stage_memory(model, spec.system, group, spec.precision, spec.serving, i, layers,
                                    i == len(ranges) - 1, ratio), group, spec, slots)
        for i, layers in enumerate(ranges))
    binding_stage = min(range(len(stages)), key=lambda i: stages[i].sessions)
    sessions, binding = _binding(stages[binding_stage], spec.serving.max_running_requests)
    backend = attention_backend(spec.serving.attention_backend, group.dcp, spec.system.native_mxfp4,
                                spec.precision.kv_cache_flag, f"{group.role} group {group.label()}")
    states = states_per_cached_session(spec.workload.session_tokens,
                                       group.chunked_prefill_size or DEFAULT_PREFILL_CHUNK,
                                       spec.serving.mamba_states_per_path)
    host = host_tier(stages, group, spec, states)
    return GroupPlan(group, stages, binding_stage, slots, exact, sessions, binding, _notes(group, spec), states,
                     cached_sessions(stages, group, spec, states), host,
                     None if host is None else group.dp_attention * host.sessions,
                     attention_backend=backend)


def make_plan(spec: PlanSpec, model: K3Config | None = None) -> PlanResult:
    """Check the topology, then size every group. Raises PlanError for a plan that cannot work."""
    model = model or spec.load_model()
    check_topology(spec.topology, model, spec.system)
    groups = tuple(plan_group(model, g, spec) for g in spec.topology.groups)
    return PlanResult(spec, model, checkpoint_bytes(model, spec.precision.experts_mxfp4), groups)
