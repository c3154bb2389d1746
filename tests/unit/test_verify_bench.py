"""`k3 bench verify` / `k3 bench profile-verify` without servers: prompt builders, summary math, goals, bad args."""
from __future__ import annotations

import json

import pytest

from k3_sglang.tooling.bench import profile_verify as pv
from k3_sglang.tooling.bench import verify as vb
from k3_sglang.tooling.bench import verify_report as vr


def _has_repeated_span(ids: list[int], span: int = 12) -> bool:
    seen = set()
    for i in range(len(ids) - span + 1):
        key = tuple(ids[i:i + span])
        if key in seen:
            return True
        seen.add(key)
    return False


def test_agent_prompts_re_quote_spans_and_end_inside_a_quote():
    for seed in range(20):
        ids = vb.agent_prompt(128, seed)
        assert 128 <= len(ids) <= 128 + 32
        assert _has_repeated_span(ids), f"seed {seed}: no 12-token span appears twice"
        tail = tuple(ids[-4:])  # the prompt ends inside a quote: its last tokens occurred before
        assert any(tuple(ids[i:i + 4]) == tail for i in range(len(ids) - 4))
        assert all(0 <= t < vb.VOCAB for t in ids)


def test_chat_prompts_do_not_repeat_spans():
    for seed in range(20):
        ids = vb.chat_prompt(128, seed)
        assert len(ids) == 128 and all(0 <= t < vb.VOCAB for t in ids)
        assert not _has_repeated_span(ids, 6)


@pytest.mark.parametrize("workload", vb.WORKLOADS)
def test_prompts_are_distinct_per_request_round_and_concurrency(workload):
    conc = [1, 4, 16]
    per = vb.requests_per_worker(conc, 4)
    assert per == {1: 4, 4: 1, 16: 1}
    prompts = vb.build_prompts(workload, 2, conc, per, 64)
    assert set(prompts) == {(r, c) for r in range(2) for c in conc}
    assert all(len(prompts[(r, c)]) == c * per[c] for r, c in prompts)
    flat = [tuple(p) for ps in prompts.values() for p in ps]
    assert len(flat) == len(set(flat)) == 2 * (4 + 4 + 16)
    assert vb.build_prompts(workload, 2, conc, per, 64) == prompts  # deterministic: same prompts for every arm
    others = {tuple(p) for w in vb.WORKLOADS if w != workload
              for ps in vb.build_prompts(w, 2, conc, per, 64).values() for p in ps}
    assert not others & set(flat)


def _req(key, tokens, decode_s, accept=None):
    return vr.RequestResult(key, 0.05, decode_s, tuple(range(tokens)), accept)


def test_decode_rate_pools_requests_and_scales_by_concurrency():
    reqs = [_req("a", 11, 1.0), _req("b", 21, 3.0)]  # 10 + 20 tokens after the first in 4 s
    assert vr.decode_rate(reqs, 1) == pytest.approx(7.5)
    assert vr.decode_rate(reqs, 2) == pytest.approx(15.0)
    cell = vr.CellRun(2, 5.0, tuple(reqs))
    assert cell.e2e_tps == pytest.approx(32 / 5.0)
    with pytest.raises(ValueError):
        vr.decode_rate([_req("c", 1, 0.0)], 1)


def test_step_totals_accept_length_and_plain_decode_fraction():
    recs = [{"kind": "verify", "n_reqs": 4, "n_tokens": 20, "l_max": 5, "seconds": 0.1, "drafted": 16, "accepted": 8},
            {"kind": "verify", "n_reqs": 2, "n_tokens": 6, "l_max": 3, "seconds": 0.1, "drafted": 4, "accepted": 1},
            {"kind": "decode", "n_reqs": 4, "n_tokens": 4, "l_max": 1, "seconds": 0.1, "drafted": 0, "accepted": 0}]
    t = vr.StepTotals.of(recs)
    assert t.decode_fraction == pytest.approx(1 / 3)
    assert t.accept_length == pytest.approx((6 + 9) / 6)
    assert t.tokens_per_step == pytest.approx((10 + 9) / 10)
    both = t + t
    assert both.accept_length == pytest.approx(t.accept_length) and both.verify_steps == 4
    assert vr.StepTotals().accept_length is None and vr.StepTotals().decode_fraction is None


def test_cell_summary_medians_and_accept_source():
    runs = [vr.CellRun(1, 1.0, (_req("a", 11, d),), vr.StepTotals(1, 1, 1, 1, 3)) for d in (1.0, 2.0, 10.0)]
    s = vr.summarize_cell(runs)
    assert s.decode_tps == pytest.approx(5.0)  # median of 10, 5, 1
    assert s.e2e_tps == pytest.approx(11.0)
    assert s.verify_accept == pytest.approx(4.0)  # 3 verify steps of 1 request, 9 drafts accepted
    assert s.tokens_per_round == pytest.approx(15 / 6)  # no meta_info: (6 request-rounds + 9) / 6
    assert s.decode_fraction == pytest.approx(0.5)
    meta = vr.summarize_cell([vr.CellRun(1, 1.0, (_req("a", 11, 1.0, 2.5), _req("b", 11, 1.0, 3.5)))])
    assert meta.tokens_per_round == pytest.approx(3.0) and meta.verify_accept is None


def test_identity_counts_mismatches_and_missing_arms():
    same = (1, 2, 3)
    outputs = {"w/0": {"A": same, "B": same, "C": same, "oracle": same},
               "w/1": {"A": same, "B": same, "C": (1, 2, 4)},
               "w/2": {"A": same, "B": same}}
    assert vr.identity(outputs) == (1, 3, ["w/1", "w/2"])
    assert vr.agreement_with_a(outputs) == {"B": (3, 3), "C": (1, 2), "oracle": (1, 1)}
    lines = vr.identity_lines(outputs, ["w"])
    assert "OUTPUT MISMATCH" in lines[0] and "1 / 3" in lines[0] and "C = A on 1 / 2" in lines[0]


def _cells(rates: dict[int, tuple[float, float, float]]):
    return {("w", c, arm): vr.CellSummary(r, r, None, None, None, 2)
            for c, abc in rates.items() for arm, r in zip(vr.ARMS, abc)}


def test_goals_tolerance_and_top_concurrency_where_verify_all_loses():
    cells = _cells({1: (100.0, 200.0, 198.5), 16: (400.0, 300.0, 395.0), 64: (800.0, 400.0, 700.0)})
    g = vr.goals(cells, "w", [1, 16, 64])
    assert g["every_c"] == {1: True, 16: False, 64: False}  # 198.5 >= 0.99*200; 395 < 0.99*400
    assert not g["goal1"]
    assert g["top_loses"] == 64 and g["top_ratio"] == pytest.approx(1.75) and g["goal2"] is True
    text = "\n".join(vr.goal_lines(cells, "w", [1, 16, 64]))
    assert "**NOT met** (fails at c = 16, 64; " in text and "C/B = 1.750, **met**" in text
    assert "C/max(A,B) per round -, no round met it" in text  # summaries without per-round rates
    never = vr.goals(_cells({1: (100.0, 200.0, 200.0), 4: (100.0, 150.0, 149.0)}), "w", [1, 4])
    assert never["goal1"] and never["top_loses"] is None and never["goal2"] is None
    table = vr.workload_table(cells, "w", [1, 16, 64])
    assert "| 64 | 800.0 | 400.0 | 700.0 | 0.875 | 1.750 | 0.875 |" in table


def test_goal_lines_name_each_missed_cells_spread_and_a_miss_within_the_noise():
    """Per-round rates: a cell that misses on its medians but met the bar in some round is a miss within the noise;
    one that missed in every round is not."""
    def cell(rates):
        return vr.CellSummary(sorted(rates)[len(rates) // 2], 1.0, None, None, None, len(rates), tuple(rates),
                              (1.0,) * len(rates))

    rounds = {1: ((100.0, 100.0, 100.0), (200.0, 200.0, 200.0), (190.0, 201.0, 185.0)),  # round 2 met it
              16: ((400.0, 400.0, 400.0), (300.0, 300.0, 300.0), (380.0, 385.0, 390.0))}  # no round met it
    cells = {("w", c, arm): cell(r) for c, by_arm in rounds.items() for arm, r in zip(vr.ARMS, by_arm)}
    g = vr.goals(cells, "w", [1, 16])
    assert g["every_c"] == {1: False, 16: False} and g["within_noise"] == {1: True, 16: False}
    assert vr.round_ratios(cells, "w", 1) == pytest.approx([0.95, 1.005, 0.925])
    text = "\n".join(vr.goal_lines(cells, "w", [1, 16]))
    assert "c = 1: C/max(A,B) per round 0.925-1.005 over 3 rounds, a round met the bar: a miss within the noise" in text
    assert "c = 16: C/max(A,B) per round 0.950-0.975 over 3 rounds, no round met it" in text
    assert "| 0.925-1.005 over 3 rounds |" in vr.workload_table(cells, "w", [1, 16])


def test_profile_steady_point_keeps_only_full_batches_with_full_chains():
    recs = [{"kind": "verify", "n_reqs": 4, "n_tokens": 16, "l_max": 4, "seconds": s} for s in (0.1, 0.3, 0.2)]
    recs += [{"kind": "verify", "n_reqs": 3, "n_tokens": 12, "l_max": 4, "seconds": 9.0},
             {"kind": "verify", "n_reqs": 4, "n_tokens": 10, "l_max": 4, "seconds": 9.0},
             {"kind": "decode", "n_reqs": 4, "n_tokens": 4, "l_max": 1, "seconds": 9.0}]
    p = pv.steady_point(recs, 4, 4)
    assert (p.n_reqs, p.l_max, p.n_tokens, p.n_steps, p.kind) == (4, 4, 16, 3, "verify")
    assert p.seconds == pytest.approx(0.2)
    assert pv.steady_point(recs, 8, 4) is None
    assert pv.steady_point(recs, 4, 1).seconds == pytest.approx(9.0)


def test_profile_fit_recovers_an_affine_cost_and_reports_residuals():
    def secs(n, length):
        return 0.002 + 0.0003 * n + (0.0001 * n * length + 0.0005 * length if length > 1 else 0.0)

    points = [pv.ProfilePoint(n, ell, n * ell, secs(n, ell), 5) for n in (1, 4, 16, 64) for ell in (1, 2, 4, 8)]
    model, residuals = pv.fit(points)
    assert max(abs(r) for r in residuals) < 1e-6
    assert model.step(16, 64, 4) == pytest.approx(secs(16, 4), rel=1e-6)
    assert model.decode(32) == pytest.approx(secs(32, 1), rel=1e-6)
    text = pv.table(points, model, residuals)
    assert "| 64 | 8 | verify | 512 | 5 |" in text and "max |r|" in text


def test_profile_read_records_from_a_mark(tmp_path):
    path = tmp_path / "steps.jsonl"
    assert pv.read_records(path, 0) == ([], 0)
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    recs, mark = pv.read_records(path, 3)
    assert recs == [{"i": 3}, {"i": 4}] and mark == 5


@pytest.mark.parametrize("argv, message", [
    (["bench", "verify", "--cost-table", "/nonexistent/cost.json", "--out", "-"], "run `k3 bench profile-verify`"),
    (["bench", "verify", "--concurrency", "128", "--out", "-"], "--concurrency values must be distinct"),
    (["bench", "verify", "--repeats", "0", "--out", "-"], "--repeats and --min-requests must be >= 1"),
    (["bench", "verify", "--pp-size", "5", "--out", "-"], "--pp-size must be in 1..4"),
    (["bench", "verify", "--model-impl", "sglang", "--pp-size", "4", "--out", "-"], "--pp-size above 2 with"),
    (["bench", "verify", "--model-impl", "sglang", "--cost-table", "/nonexistent/c.json", "--out", "-"],
     "run `k3 bench profile-verify`"),
    (["bench", "profile-verify", "--lengths", "1", "16", "--out", "-"], "--lengths must be in 1..--width"),
    (["bench", "profile-verify", "--lengths", "2", "4", "--out", "-"], "--lengths needs 1"),
    (["bench", "profile-verify", "--batches", "4", "--out", "-"], "--batches must be at least two"),
])
def test_bad_arguments_exit_2_before_starting_servers(argv, message, capsys):
    from k3_sglang.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_cost_table_exits_2(tmp_path, capsys):
    from k3_sglang.cli import main

    bad = tmp_path / "cost.json"
    bad.write_text("{not json")
    assert main(["bench", "verify", "--cost-table", str(bad), "--out", "-"]) == 2
    assert "--cost-table" in capsys.readouterr().err


def test_write_report_renders_tables_goals_identity_and_plot(tmp_path):
    import argparse
    import datetime

    args = argparse.Namespace(concurrency=[1, 16, 64], repeats=2, max_new_tokens=64, prompt_tokens=128, min_requests=4,
                              workloads=["w"], width=8, profile="mix", cost_table="cost.json", dtype=None,
                              out=str(tmp_path / "bench-verify.md"))
    cells = _cells({1: (100.0, 200.0, 198.5), 16: (400.0, 300.0, 395.0), 64: (800.0, 400.0, 700.0)})
    outputs = {"w/0": {"A": (1,), "B": (1,), "C": (2,)}}
    started = datetime.datetime(2026, 12, 3, 17, 0, tzinfo=datetime.timezone.utc)
    text = vr.write_report(args, started, (0.5, 0.5, 0.5), cells, outputs, [1, 16, 64], {1: 4, 16: 1, 64: 1}, tmp_path)
    assert (tmp_path / "bench-verify.md").read_text() == text
    assert (tmp_path / "bench-verify.png").stat().st_size > 1000
    assert "Run 2026-12-03 17:00 UTC" in text and "OUTPUT MISMATCH" in text and "## w" in text
    assert "C/B = 1.750, **met**" in text and "![tokens/s vs concurrency](bench-verify.png)" in text
    assert "--pp-size" not in text
    args.pp_size, args.out = 2, str(tmp_path / "bench-verify-pp2.md")
    piped = vr.write_report(args, started, (0.5, 0.5, 0.5), cells, outputs, [1, 16, 64], {1: 4, 16: 1, 64: 1}, tmp_path)
    assert "--pp-size 2\n```" in piped and "`--pp-size 2` (every arm a pipeline)" in piped


def test_model_impl_picks_its_own_cost_table_and_report():
    """SGLang's K3 (the one model) has its own step costs: its bench reads docs/verify-cost-cpu-sglang.json and writes
    its own report, with or without --model-impl; the portable model's choice is gone."""
    import argparse

    from k3_sglang.tooling.bench import profile_verify, verify

    parser = argparse.ArgumentParser()
    verify.add_arguments(parser)
    args = parser.parse_args(["--model-impl", "sglang"])
    try:
        verify.check_args(args)
    except Exception:  # noqa: BLE001 - the table may not be measured yet; the defaults are set before the check
        pass
    assert args.cost_table == str(verify.COST_SGLANG) and args.out == str(verify.DOC_SGLANG)
    plain = parser.parse_args([])
    verify.check_args(plain)
    assert plain.cost_table == str(verify.COST_SGLANG) and plain.out == str(verify.DOC_SGLANG)
    assert profile_verify.model_env("sglang") == {}  # no model variable: one model
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-impl", "portable"])
