"""The structural figures the seed analysis says to plan against, reproduced by the planner."""

from __future__ import annotations

import dataclasses

import pytest

from k3_sglang.config import preset
from k3_sglang.plan.capacity import stage_capacity
from k3_sglang.plan.memory import kv_bytes_per_token, pool_tokens, state_bytes_per_slot
from k3_sglang.plan.precision import Precision
from k3_sglang.plan.topology import Group
from k3_sglang.plan.units import GIB, MIB, to_gib
from k3_sglang.plan.weights import checkpoint_bytes, expert_bytes
from plan_helpers import plan_for, spec_for

K3 = preset("k3-full")
ALL_LAYERS = range(K3.num_layers)


def test_mla_latent_is_27648_bytes_per_token_over_24_layers():
    assert K3.num_mla_layers == 24 and K3.num_kda_layers == 69
    assert kv_bytes_per_token(K3, ALL_LAYERS, Precision(kv_cache="bf16")) == 27_648
    assert kv_bytes_per_token(K3, ALL_LAYERS, Precision(kv_cache="fp8_e4m3")) == 13_824


def test_308608_tokens_fill_a_7_95_gib_pool():
    pool = 308_608 * 27_648
    assert round(to_gib(pool), 2) == 7.95
    assert pool_tokens(pool, 27_648, 64) == 308_608 == 4_822 * 64
    assert pool_tokens(pool - 1, 27_648, 64) == 308_608 - 64  # one byte short loses a whole page


def test_kda_state_per_request_and_per_tp_rank():
    fp32 = Precision(kda_state="fp32")
    assert K3.kda_state_bytes_per_request(4, 2) == 449_372_160
    assert state_bytes_per_slot(K3, ALL_LAYERS, Group(tp=1), fp32) == 449_372_160
    assert state_bytes_per_slot(K3, ALL_LAYERS, Group(tp=8), fp32) == 449_372_160 // 8
    assert round(state_bytes_per_slot(K3, ALL_LAYERS, Group(tp=8), fp32) / MIB, 1) == 53.6
    assert round(state_bytes_per_slot(K3, ALL_LAYERS, Group(tp=16), fp32) / MIB, 1) == 26.8
    assert state_bytes_per_slot(K3, ALL_LAYERS, Group(tp=1), Precision(kda_state="bf16")) == 232_316_928
    # DP-attention shards KDA heads over attention-TP only
    assert state_bytes_per_slot(K3, ALL_LAYERS, Group(tp=8, dp_attention=2), fp32) == 449_372_160 // 4


def test_weights_reproduce_the_published_text_checkpoint():
    assert expert_bytes(K3, mxfp4=True) == 17_547_264
    assert checkpoint_bytes(K3, mxfp4=True) == 1_559_965_606_912
    assert checkpoint_bytes(K3, mxfp4=False) > 5e12  # bf16 experts: ~3.6x bigger


def test_dcp8_holds_8x_the_logical_kv_of_dcp1_on_the_same_budget():
    plan = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 1}])
    spec = plan.spec
    same_memory = plan.groups[0].bound.memory
    dcp1 = stage_capacity(same_memory, Group(tp=8, ep=8, dcp=1), spec, 5)
    dcp8 = stage_capacity(same_memory, Group(tp=8, ep=8, dcp=8), spec, 5)
    assert dcp8.logical_kv_tokens == 8 * dcp1.logical_kv_tokens


def test_dcp8_over_dcp1_in_a_full_plan_is_just_under_8_because_of_replicated_q():
    dcp1 = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 1}]).groups[0].bound
    dcp8 = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 8}]).groups[0].bound
    ratio = dcp8.logical_kv_tokens / dcp1.logical_kv_tokens
    assert 7.5 < ratio < 8.0  # SGLang reports "about 7.9x" on K3
    assert dcp8.memory.replicated_q_bytes > GIB
    no_rep = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 8}], serving={"replicate_q_proj": False}).groups[0].bound
    assert no_rep.logical_kv_tokens == pytest.approx(8 * dcp1.logical_kv_tokens, rel=1e-4)


def test_pool_split_follows_sglang_mamba_ratio():
    bound = plan_for(serving={"mamba_full_memory_ratio": 0.9}).groups[0].bound.memory
    assert bound.state_pool_bytes == int(bound.rest_bytes * 0.9 / 1.9)
    assert bound.kv_pool_bytes + bound.state_pool_bytes == bound.rest_bytes
    assert bound.state_slots == bound.state_pool_bytes // bound.state_bytes_per_slot - 1


def test_balanced_ratio_makes_both_pools_bind_together():
    group = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 8}], serving={"mamba_full_memory_ratio": "auto"}).groups[0]
    bound = group.bound
    assert bound.memory.mamba_ratio == round(group.balanced_ratio, 3)
    assert abs(bound.sessions_by_kv - bound.sessions_by_state) <= 2
    # r* = (S + D) * token_equiv * dcp / L
    expected = 5 * (449_372_160 // 8 / 27_648) * 8 / 104_096
    assert group.balanced_ratio == pytest.approx(expected)


def test_state_slots_per_request_follow_overlap_and_strategy():
    spec = spec_for()
    assert spec.serving.state_slots_per_request(overlap=True) == 5
    assert spec.serving.state_slots_per_request(overlap=False) == 4
    lazy = dataclasses.replace(spec.serving, mamba_radix_cache_strategy="extra_buffer_lazy")
    assert lazy.state_slots_per_request(overlap=True) == 4
    pp = plan_for(groups=[{"tp": 1, "pp": 8}]).groups[0]
    assert pp.slots_per_request == 4


def test_pd_decode_groups_hold_one_state_slot_per_request_unless_they_keep_a_radix_cache():
    # SGLang 0.5.23: a PD decode server runs with disable_radix_cache (pd_disaggregation_hook.py) unless
    # --disaggregation-decode-enable-radix-cache, and _calculate_mamba_ratio() is then 1
    spec = spec_for()
    assert spec.serving.state_slots_per_request(overlap=True, role="decode") == 1
    assert spec.serving.state_slots_per_request(overlap=True, role="prefill") == 5
    radix = dataclasses.replace(spec.serving, decode_radix_cache=True)
    assert radix.state_slots_per_request(overlap=True, role="decode") == 5
    pd = [{"role": "prefill", "tp": 1, "pp": 8, "replicas": 2},
          {"role": "decode", "tp": 8, "dcp": 8, "ep": 8, "replicas": 7}]
    auto = {"mamba_full_memory_ratio": "auto"}
    one = plan_for(groups=pd, serving=auto)
    five = plan_for(groups=pd, serving={**auto, "decode_radix_cache": True})
    decode_one, decode_five = one.groups[1], five.groups[1]
    assert (decode_one.slots_per_request, decode_five.slots_per_request) == (1, 5)
    assert one.groups[0].slots_per_request == five.groups[0].slots_per_request == 4  # prefill PP8: overlap off
    # r* scales with S: a 5x smaller state pool balances the same sessions (review.md H2: 0.781 -> 0.156)
    assert decode_one.balanced_ratio == pytest.approx(decode_five.balanced_ratio / 5)
    assert decode_one.sessions > decode_five.sessions * 1.4  # 149 vs 97 per decode group on GB300
    assert one.total_sessions == 7 * decode_one.sessions


def test_rendered_decode_flags_agree_with_the_planned_slots():
    from k3_sglang.launch.golden import render_example

    sbatch = render_example("agent-100k")["k3-agent-100k.sbatch"]
    decode_lines = [line for line in sbatch.splitlines() if "--disaggregation-mode decode" in line]
    assert decode_lines and all("--disaggregation-decode-enable-radix-cache" not in line for line in decode_lines)
    assert all("--mamba-full-memory-ratio 0.156" in line for line in decode_lines)  # sized for S = 1
    from k3_sglang.launch.render import render_artefacts
    from k3_sglang.launch.settings import LaunchSettings
    from k3_sglang.plan.presets import plan_preset

    doc = plan_preset("agent-100k")
    doc["serving"] = {**doc.get("serving", {}), "decode_radix_cache": True}
    rendered = render_artefacts(plan_for(groups=doc["groups"], serving=doc["serving"]), LaunchSettings())
    text = next(v for k, v in rendered.items() if k.endswith(".sbatch"))
    decode_lines = [line for line in text.splitlines() if "--disaggregation-mode decode" in line]
    assert decode_lines and all("--disaggregation-decode-enable-radix-cache" in line for line in decode_lines)
    assert all("--mamba-full-memory-ratio 0.781" in line for line in decode_lines)  # sized for S = 5


def test_pp_stages_follow_sglang_default_split_and_bind_on_the_largest():
    group = plan_for(groups=[{"tp": 1, "pp": 8}]).groups[0]
    sizes = [s.memory.num_layers for s in group.stages]
    assert sizes == [11, 11, 11, 12, 12, 12, 12, 12] and sum(sizes) == 93
    assert group.stages[0].memory.first_layer == 0 and group.stages[-1].memory.last_layer == 92


def test_fp8_kv_and_bf16_state_raise_their_ceilings():
    base = plan_for(serving={"mamba_full_memory_ratio": 0.9}).groups[0].bound
    fp8 = plan_for(serving={"mamba_full_memory_ratio": 0.9}, precision={"kv_cache": "fp8_e4m3"}).groups[0].bound
    bf16 = plan_for(serving={"mamba_full_memory_ratio": 0.9}, precision={"kda_state": "bf16"}).groups[0].bound
    assert fp8.memory.kv_tokens == pytest.approx(2 * base.memory.kv_tokens, abs=64)
    assert bf16.memory.state_slots > 1.9 * base.memory.state_slots
