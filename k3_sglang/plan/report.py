"""The plan as JSON (machine-readable) and as a table (for people)."""

from __future__ import annotations

from typing import Any

from k3_sglang.plan.capacity import GroupPlan, PlanResult, StageCapacity
from k3_sglang.plan.precision import CONV_STATE_BYTES
from k3_sglang.plan.units import MIB, human_tokens, to_gib


def _gib(nbytes: float) -> float:
    return round(to_gib(nbytes), 3)


def stage_json(stage: StageCapacity) -> dict[str, Any]:
    """One PP stage's per-GPU memory and group-wide ceilings."""
    m = stage.memory
    return {"stage": m.stage, "layers": [m.first_layer, m.last_layer], "weights_gib": _gib(m.weights_bytes),
            "replicated_q_gib": _gib(m.replicated_q_bytes), "reserve_gib": _gib(m.reserve_bytes),
            "rest_gib": _gib(m.rest_bytes), "kv_pool_gib": _gib(m.kv_pool_bytes),
            "state_pool_gib": _gib(m.state_pool_bytes), "kv_bytes_per_token": m.kv_bytes_per_token,
            "state_bytes_per_slot": m.state_bytes_per_slot, "kv_tokens_per_rank": m.kv_tokens,
            "state_slots_per_rank": m.state_slots, "logical_kv_tokens": stage.logical_kv_tokens,
            "sessions_by_kv": stage.sessions_by_kv, "sessions_by_state": stage.sessions_by_state}


def group_json(plan: GroupPlan) -> dict[str, Any]:
    """One group: its parallelism, the binding stage's figures, and every stage."""
    g, bound = plan.group, plan.bound
    return {"label": g.label(), **g.to_dict(), "gpus": g.gpus, "attn_tp": g.attn_tp,
            "mamba_ratio": bound.memory.mamba_ratio, "balanced_ratio": round(plan.balanced_ratio, 4),
            "slots_per_request": plan.slots_per_request, "binding_stage": plan.binding_stage,
            **{k: v for k, v in stage_json(bound).items() if k not in ("stage", "layers")},
            "sessions": plan.sessions, "binding": plan.binding, **cached_json(plan), "notes": list(plan.notes),
            "attention_backend": plan.attention_backend,
            "stages": [stage_json(s) for s in plan.stages]}


def cached_json(plan: GroupPlan) -> dict[str, Any]:
    """Paused sessions the group keeps between turns: on device (with the binding pool) and on the host tier."""
    device, host = plan.cached_device, plan.host
    return {"states_per_cached_session": plan.states_per_session,
            "cached_sessions_device": None if device is None else device.sessions,
            "cached_device_binding": None if device is None else device.binding,
            "cached_sessions_host": plan.cached_host,
            "host_tier": None if host is None else {
                "kv_gib_per_rank": _gib(host.kv_bytes), "state_gib_per_rank": _gib(host.state_bytes),
                "kv_fraction": round(host.kv_fraction, 4), "kv_bytes_per_session": host.kv_bytes_per_session,
                "state_bytes_per_session": host.state_bytes_per_session}}


def model_json(result: PlanResult) -> dict[str, Any]:
    """The model-level structural figures the plan rests on."""
    model, precision = result.model, result.spec.precision
    return {"name": model.name, "checkpoint_bytes": result.checkpoint_bytes,
            "num_layers": model.num_layers, "num_kda_layers": model.num_kda_layers,
            "num_mla_layers": model.num_mla_layers,
            "mla_kv_bytes_per_token": model.mla_kv_bytes_per_token(precision.kv_bytes),
            "kda_state_bytes_per_request": model.kda_state_bytes_per_request(precision.ssm_bytes, CONV_STATE_BYTES)}


def plan_json(result: PlanResult) -> dict[str, Any]:
    """{"spec": inputs, "result": figures}; `k3 launch render` accepts this document as a plan file."""
    return {"spec": result.spec.to_dict(),
            "result": {"model": model_json(result), "total_gpus": result.spec.topology.total_gpus,
                       "total_sessions": result.total_sessions, "target_sessions": result.spec.workload.sessions,
                       "meets_target": result.meets_target, "groups": [group_json(g) for g in result.groups]}}


COLUMNS = ("group", "x", "GPUs", "weights", "reserve", "KV pool", "state pool", "ratio (r*)",
           "KV tok/rank", "logical KV", "slots/rank", "S", "by KV", "by state", "sessions", "binding",
           "cached dev", "cached host")


def _row(plan: GroupPlan) -> tuple[str, ...]:
    g, s, m = plan.group, plan.bound, plan.bound.memory
    opt = lambda v: "-" if v is None else str(v)  # noqa: E731
    return (g.label(), str(g.replicas), str(g.gpus), f"{to_gib(m.weights_bytes + m.replicated_q_bytes):.1f}",
            f"{to_gib(m.reserve_bytes):.1f}", f"{to_gib(m.kv_pool_bytes):.2f}", f"{to_gib(m.state_pool_bytes):.2f}",
            f"{m.mamba_ratio:.3f} ({plan.balanced_ratio:.3f})", opt(m.kv_tokens),
            "-" if s.logical_kv_tokens is None else human_tokens(s.logical_kv_tokens), opt(m.state_slots),
            str(plan.slots_per_request), opt(s.sessions_by_kv), opt(s.sessions_by_state), str(plan.sessions),
            plan.binding, "-" if plan.cached_device is None else str(plan.cached_device.sessions),
            opt(plan.cached_host))


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
            for r in rows]


def plan_table(result: PlanResult) -> str:
    """A readable summary: header lines, one row per group (GiB per GPU), notes, and the verdict."""
    spec, model = result.spec, result.model
    p, w, sysm = spec.precision, spec.workload, spec.system
    kda = model.kda_state_bytes_per_request(p.ssm_bytes, CONV_STATE_BYTES)
    lines = [f"k3 plan: {spec.name} on {sysm.name} ({sysm.num_gpus} x {sysm.gpu_name}, "
             f"{sysm.gpu_memory_gib:.1f} GiB each), model {model.name}",
             f"  weights {result.checkpoint_bytes:,} B ({p.experts} experts); MLA KV "
             f"{model.mla_kv_bytes_per_token(p.kv_bytes):,} B/token ({p.kv_cache}, {model.num_mla_layers} layers); "
             f"KDA state {kda / MIB:.1f} MiB/request ({p.kda_state} state + bf16 conv, {model.num_kda_layers} layers)",
             f"  workload: {w.sessions} sessions of {w.context_length:,} + {w.output_length:,} tokens; "
             f"mem_fraction_static {spec.serving.mem_fraction_static}, mamba ratio "
             f"{spec.serving.mamba_full_memory_ratio}", ""]
    lines += _table([COLUMNS] + [_row(g) for g in result.groups])
    lines.append("  (per GPU in GiB, at each group's binding PP stage; sessions per replica; cached: paused "
                 "sessions kept between turns)")
    for g in result.groups:
        if g.host is not None:
            lines.append(f"  host tier: {g.group.label()}: {spec.serving.hicache_host_gib:g} GiB per rank = "
                         f"{to_gib(g.host.kv_bytes):.2f} GiB latent rows + {to_gib(g.host.state_bytes):.2f} GiB KDA "
                         f"states ({g.states_per_session} per session)")
    for g in result.groups:
        lines += [f"  note: {g.group.label()}: {n}" for n in g.notes]
    verdict = "meets" if result.meets_target else "MISSES"
    lines.append(f"total: {spec.topology.total_gpus} GPUs, {result.total_sessions} concurrent sessions "
                 f"({verdict} the target of {w.sessions})")
    return "\n".join(lines) + "\n"
