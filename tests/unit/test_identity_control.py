"""The bf16 identity control (tooling/bench/identity_control.py) without servers: the control's requests, its
envelope, and the judgement of spec arms against it (a bug-like arm fails, batch-shape-like flips pass)."""
from __future__ import annotations

import math

import pytest

from k3_sglang.tooling.bench import output_identity as oi
from k3_sglang.tooling.bench.identity_control import CONTROL_ARM, Envelope, control_groups, judge, judgement_lines


def _m(arm: str, key: str, gap: float | None, rank: int | None, tie: bool = False) -> oi.Mismatch:
    return oi.Mismatch(key, arm, 3, 10, 11, oi.Verdict(tie, gap, 0.01 if tie else None, "test", rank))


def test_control_groups_rerun_each_prompt_at_another_batch_shape():
    keys = [f"k{i}" for i in range(5)]
    assert control_groups(keys, 16) == [[k] for k in keys]  # the rounds ran 16 together: alone
    assert control_groups(keys, 1) == [["k0", "k1"], ["k2", "k3"], ["k4", "k0"]]  # alone in the rounds: pairs
    assert control_groups([f"k{i}" for i in range(40)], 4, limit=16) == [[f"k{i}"] for i in range(16)]


def test_classify_reports_the_arm_tokens_rank_in_the_probe_row():
    row = [0.0] * 16
    row[3], row[5], row[7] = 8.0, 8.005, 7.0
    assert oi.classify(3, 7, row, "bfloat16").rank == 3
    assert oi.classify(5, 3, row, "bfloat16").rank == 2


def test_the_envelope_is_the_controls_worst_flip_and_nan_never_passes():
    control = [_m(CONTROL_ARM, "a", 0.5, 3), _m(CONTROL_ARM, "b", 1.2, 2), _m(CONTROL_ARM, "c", None, None)]
    env = Envelope.of(control, compared=16)
    assert (env.flipped, env.max_gap, env.max_rank) == (3, 1.2, 3)
    assert env.holds(_m("D", "x", 1.2, 3)) and env.holds(_m("D", "x", 0.1, 1))
    assert not env.holds(_m("D", "x", 1.3, 1))  # a larger gap than batch shape ever made
    assert not env.holds(_m("D", "x", 0.2, 4))  # a token ranked lower than any control flip picked
    assert not env.holds(_m("D", "x", float("nan"), 1)) and not env.holds(_m("D", "x", None, None))
    assert env.holds(_m("D", "x", 5.0, 9, tie=True))  # near ties pass whatever the control did
    quiet = Envelope.of([], compared=16)  # a control that never flipped excuses nothing but near ties
    assert not quiet.holds(_m("D", "x", 1e-6, 2)) and quiet.holds(_m("D", "x", 1e-6, 2, tie=True))


def test_allowed_flips_is_the_controls_share_plus_three_standard_errors():
    env = Envelope(compared=16, flipped=4, max_gap=1.0, max_rank=2)
    p = 4 / 16
    assert env.allowed_flips(64) == math.floor(64 * (p + 3 * math.sqrt(p * (1 - p) / 16)))
    assert env.allowed_flips(64) < 64
    assert Envelope(16, 0, None, None).allowed_flips(100) == math.floor(100 * (1 / 16 + 3 * math.sqrt(
        (1 / 16) * (15 / 16) / 16)))  # no flip: one counted, so a tiny control does not forbid every flip
    assert Envelope(0, 0, None, None).allowed_flips(10) == 0


def test_judge_passes_batch_shape_like_flips_and_fails_a_bug_like_arm():
    """The control flipped 6 of 16 prompts with gaps up to 1.0 at ranks up to 3. Arm D flips as often with tokens
    inside that envelope: within the control. Arm C flips 15 of 16 (a rate far above the control's) and arm S picks
    a token ranked 40th once (what a wrong KV slot or a skipped commit looks like): both fail."""
    control = [_m(CONTROL_ARM, f"k{i}", 0.2 * (i + 1) if i < 5 else 1.0, 1 + i % 3) for i in range(6)]
    d = [_m("D", f"k{i}", 0.3, 2) for i in range(5)]
    c = [_m("C", f"k{i}", 0.5, 2) for i in range(15)]
    s = [_m("S", "k0", 0.4, 40)]
    got = {j.arm: j for j in judge(control + d + c + s, {"A": 16, "D": 16, "C": 16, "S": 16}, control_compared=16)}
    assert set(got) == {"C", "D", "S"}
    assert got["D"].ok and got["D"].flipped == 5 and not got["D"].outside
    assert not got["C"].ok and got["C"].flipped == 15 > got["C"].allowed and not got["C"].outside
    assert not got["S"].ok and len(got["S"].outside) == 1 and got["S"].flipped <= got["S"].allowed
    text = "\n".join(judgement_lines(list(got.values())))
    assert text.count("**FAIL**") == 2 and "rank 40" in text


@pytest.mark.parametrize("flipped", [0, 1])
def test_an_arm_without_mismatches_is_within_any_control(flipped):
    control = [_m(CONTROL_ARM, "k0", 0.3, 2)][:flipped]
    (j,) = judge(control, {"A": 8, "D": 8}, control_compared=8)
    assert j.ok and j.flipped == 0


def test_the_plain_decode_report_prints_the_control_and_each_arms_verdict():
    """A bf16 section: A and D steps, D's mismatches within a control that flipped, the report shows both lines."""
    from k3_sglang.tooling.bench.plain_decode import ARM_HELP, ArmSteps, judge_sections
    from k3_sglang.tooling.bench.plain_decode_report import model_section

    rows = [{"t": i, "b": 4, "loop": 0.031, "run": 0.0305, "fwd": 0.030, "result": 0.0} for i in range(12)]
    steps = ArmSteps.of(rows, 4)
    a = {"steps": steps, "decode_tps": 100.0, "per_request": [steps], "outputs": [(1, 2, 3)] * 8}
    d = {**a, "outputs": [(1, 2, 4)] * 2 + [(1, 2, 3)] * 6}
    mism = [_m(CONTROL_ARM, f"sglang/c4/0/{i}", 0.6, 3) for i in range(3)]
    mism += [_m("D", f"sglang/c4/0/{i}", 0.5, 2) for i in range(2)]
    per_model = {"sglang": {4: {"A": a, "D": d}}}
    judged = judge_sections(per_model, mism, {"sglang": {4: 8}})
    (js, n), = judged.values()
    assert n == 8 and [j.ok for j in js] == [True]
    text = "\n".join(model_section("sglang", 4, per_model["sglang"][4], ARM_HELP, mism, "bfloat16", judged[("sglang", 4)]))
    assert "control A~" in text and "3 / 8 prompts flipped" in text and "D: 2 / 8 prompts flipped" in text
    assert "within the control" in text and "**FAIL**" not in text
