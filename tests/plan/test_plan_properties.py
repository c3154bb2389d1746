"""Property tests: more DCP never lowers logical KV; the binding ceiling is always the smallest one."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3_sglang.plan import PlanError
from k3_sglang.plan.capacity import KV_CEILING, RUNNING_CEILING, STATE_CEILING
from plan_helpers import plan_for

SYSTEMS = st.sampled_from(["gb300-nvl72", "gb200-nvl72", "b300-8x"])
RATIOS = st.one_of(st.just("auto"), st.floats(min_value=0.05, max_value=4.0))
PRECISIONS = st.fixed_dictionaries({"kv_cache": st.sampled_from(["bf16", "fp8_e4m3"]),
                                    "kda_state": st.sampled_from(["fp32", "bf16"])})
WORKLOADS = st.fixed_dictionaries({"context_length": st.integers(1_000, 1_000_000),
                                   "output_length": st.integers(0, 32_768)})
FAST = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _plan(system, tp, dcp, ratio, precision, workload, **serving):
    return plan_for(system, [{"tp": tp, "ep": tp, "dcp": dcp}], precision=precision, workload=workload,
                    serving={"mamba_full_memory_ratio": ratio, **serving})


FIXED_RATIOS = st.floats(min_value=0.05, max_value=4.0)


@FAST
@given(system=SYSTEMS, tp=st.sampled_from([4, 8, 16, 32]), ratio=FIXED_RATIOS, precision=PRECISIONS,
       workload=WORKLOADS, replicate_q=st.booleans())
def test_more_dcp_never_lowers_logical_kv(system, tp, ratio, precision, workload, replicate_q):
    """On the same budget (a fixed state/KV split). With ratio='auto' the solver moves memory from KV to
    state slots as DCP grows (it maximises sessions), so logical KV may drop by a page there."""
    previous = None
    for dcp in (d for d in (1, 2, 4, 8, 16, 32) if tp % d == 0):
        try:
            group = _plan(system, tp, dcp, ratio, precision, workload, replicate_q_proj=replicate_q).groups[0]
        except PlanError:
            return  # this system cannot hold the model at this TP
        logical = group.bound.logical_kv_tokens
        if previous is not None:
            assert logical >= previous, (dcp, logical, previous)
        previous = logical


@FAST
@given(system=SYSTEMS, tp=st.sampled_from([8, 16]), dcp=st.sampled_from([1, 2, 8]), ratio=RATIOS,
       precision=PRECISIONS, workload=WORKLOADS, cap=st.one_of(st.none(), st.integers(1, 400)))
def test_binding_ceiling_is_the_smallest(system, tp, dcp, ratio, precision, workload, cap):
    try:
        group = _plan(system, tp, dcp, ratio, precision, workload, max_running_requests=cap).groups[0]
    except PlanError:
        return
    bound = group.bound
    ceilings = {STATE_CEILING: bound.sessions_by_state, KV_CEILING: bound.sessions_by_kv, RUNNING_CEILING: cap}
    assert group.sessions == min(v for v in ceilings.values() if v is not None)
    assert ceilings[group.binding] == group.sessions
    if bound.sessions_by_state < min(bound.sessions_by_kv, cap or 10**9):
        assert group.binding == STATE_CEILING


@FAST
@given(context=st.integers(1_000, 16_000), ratio=st.floats(min_value=0.05, max_value=0.5))
def test_state_slots_bind_before_kv_for_short_sessions(context, ratio):
    group = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 8}], workload={"context_length": context, "output_length": 0},
                     serving={"mamba_full_memory_ratio": ratio}).groups[0]
    assert group.bound.sessions_by_state < group.bound.sessions_by_kv
    assert group.binding == STATE_CEILING


def test_kv_binds_for_long_sessions_without_dcp():
    group = plan_for(groups=[{"tp": 8, "ep": 8}], workload={"context_length": 1_000_000, "output_length": 0}).groups[0]
    assert group.binding == KV_CEILING
