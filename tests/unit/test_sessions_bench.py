"""`k3 bench sessions` without a server: the traffic plan, the arms' flags, the per-arm figures and the report.
About 3 s."""
from __future__ import annotations

import argparse
import datetime

import pytest

from k3_sglang.tooling.bench.session_traffic import SessionTraffic, TurnRecord, plan_session_prompts
from k3_sglang.tooling.bench.sessions import arm_flags
from k3_sglang.tooling.bench.sessions_summary import percentile, ratio, summarize

TRAFFIC = SessionTraffic(sessions=2, first_tokens=1000, tool_tokens=100, output_tokens=10, turns=3)


def _rec(session, turn, prompt, cached, tiers, ttft, answer=(1, 2)):
    return TurnRecord(session, turn, prompt, cached, tiers, ttft, ttft + 0.1, answer)


def test_traffic_is_reproducible_and_extends_a_shorter_run():
    small = plan_session_prompts(SessionTraffic(2, 50, 5, 1, 2, seed=3))
    big = plan_session_prompts(SessionTraffic(4, 50, 5, 1, 5, seed=3))
    assert small[0] == big[0][:2] and [t[:1] for t in big[1][:2]] == small[1]
    assert plan_session_prompts(SessionTraffic(2, 50, 5, 1, 2, seed=4))[0] != small[0]
    assert TRAFFIC.session_tokens() == 1000 + 3 * 10 + 2 * 100
    with pytest.raises(ValueError, match="sessions must be >= 1"):
        SessionTraffic(0, 1, 1, 1, 1)


def test_arm_flags_size_the_pools_from_the_traffic():
    live = 2 * TRAFFIC.session_tokens()  # 2,460 tokens
    four = SessionTraffic(sessions=8, first_tokens=1000, tool_tokens=100, output_tokens=10, turns=3)
    assert arm_flags("off", four, 4) == ["--max-total-tokens", "2560"]  # 2,460 rounded up to 256
    # 2 sessions can't be 4x oversubscribed: the pool still holds one session's last prompt (SGLang aborts longer)
    assert arm_flags("off", TRAFFIC, 4) == ["--max-total-tokens", "1536"]  # 1,230 + 64 rounded up
    host = arm_flags("host", TRAFFIC, 4)
    assert host[:3] == ["--max-total-tokens", "1536", "--enable-hierarchical-cache"]
    assert int(host[-1]) * 1536 >= live * 1.25  # the host tier holds every session
    l3 = arm_flags("host-l3", TRAFFIC, 4)
    assert l3[-2:] == ["--hicache-storage-backend", "mooncake"] and float(l3[4]) * 1536 < live
    assert int(arm_flags("resident", TRAFFIC, 4)[1]) >= live
    # the host-l3 pools, the file store, and a prefetch that waits (a KDA model discards a partial one)
    assert arm_flags("restart", TRAFFIC, 4) == l3[:-1] + ["file", "--hicache-storage-prefetch-policy", "wait_complete"]
    with pytest.raises(ValueError, match="unknown arm"):
        arm_flags("gpu", TRAFFIC, 4)


def test_summary_of_an_arm():
    off = [_rec(0, 0, 1000, 0, {}, 2.0), _rec(1, 0, 1000, 0, {}, 2.2),
           _rec(0, 1, 1110, 0, {}, 2.4), _rec(1, 1, 1110, 100, {}, 2.0)]
    host = [_rec(0, 0, 1000, 0, {}, 2.0), _rec(1, 0, 1000, 0, {}, 2.0),
            _rec(0, 1, 1110, 1009, {"device": 0, "host": 1009}, 0.2),
            _rec(1, 1, 1110, 1009, {"device": 9, "host": 500, "storage": 500}, 0.3, answer=(9,))]
    s_off, s_host = summarize("off", off, off), summarize("host", host, off)
    assert s_off.mismatches == 0 and s_host.mismatches == 1
    assert s_off.tier_share["device"] == pytest.approx(100 / 2220) and s_off.prefilled_per_turn == 1060
    assert s_host.tier_share == pytest.approx({"device": 9 / 2220, "host": 1509 / 2220, "storage": 500 / 2220})
    assert s_host.ttft_p50_s == 0.2 and s_host.ttft_p99_s == 0.3 and s_host.first_turn_ttft_p50_s == 2.0
    assert ratio(s_off, s_host) == pytest.approx(2.0 / 0.2) and ratio(None, s_host) is None
    assert s_host.cached_share == pytest.approx(2018 / 2220)
    with pytest.raises(ValueError, match="first and resumed"):
        summarize("x", off[:2])
    with pytest.raises(ValueError, match="not the baseline"):
        summarize("x", off, off[:3])


def test_percentile_is_nearest_rank():
    assert percentile([3, 1, 2], 50) == 2 and percentile([5], 99) == 5 and percentile(list(range(1, 101)), 99) == 99
    with pytest.raises(ValueError):
        percentile([], 50)


def test_report_names_the_ratios_and_the_goals(tmp_path):
    from k3_sglang.tooling.bench.sessions_report import write_report

    recs = {arm: [_rec(s, t, 1000 + 110 * t, 0 if arm == "off" or not t else 1009, {} if arm == "off" else
                       {"device": 0, "host": 1009 if t else 0}, ttft) for s in range(2) for t in range(2)]
            for arm, ttft in (("off", 3.0), ("host", 0.3), ("resident", 0.25))}
    summaries = {arm: summarize(arm, r, recs["off"]) for arm, r in recs.items()}
    args = argparse.Namespace(sessions=2, first_tokens=1000, tool_tokens=100, output_tokens=10, turns=2, think_s=0.0,
                              oversubscription=4.0, arms=list(recs), serve_args=[], out=tmp_path / "bench.md")
    write_report(args, SessionTraffic(2, 1000, 100, 10, 2), datetime.datetime(2026, 12, 6), summaries, tmp_path)
    text = (tmp_path / "bench.md").read_text()
    assert "off / host, resumed-turn TTFT p50: **10.00x** (goal >= 10x: met)" in text
    assert "host / resident, resumed-turn TTFT p50: **1.20x** (goal <= 1.5x: met)" in text
    assert "identical to `off` in every arm: yes" in text and (tmp_path / "bench.png").stat().st_size > 0
    from k3_sglang.tooling.bench.sessions_report import KEEP_MARKER

    (tmp_path / "bench.md").write_text(text + "\n" + KEEP_MARKER + "\n\n## another figure\n")
    write_report(args, SessionTraffic(2, 1000, 100, 10, 2), datetime.datetime(2026, 12, 6), summaries, tmp_path)
    again = (tmp_path / "bench.md").read_text()
    bench_part = again.split(KEEP_MARKER)[0]  # rewritten (its load average moves), the kept part as it was
    assert again.count(KEEP_MARKER) == 1 and again.endswith("## another figure\n")
    assert "off / host, resumed-turn TTFT p50: **10.00x** (goal >= 10x: met)" in bench_part


def test_restart_arm_counts_the_turns_after_the_restart():
    from k3_sglang.tooling.bench.sessions import resumed_from

    recs = [_rec(s, t, 1000 + 110 * t, 0 if t < 2 else 1100, {}, 5.0 if t < 2 else 0.5) for s in range(2)
            for t in range(3)]
    assert resumed_from("restart", TRAFFIC) == 2 and resumed_from("host", TRAFFIC) == 1
    s = summarize("restart", recs, recs, resumed_from=2)
    assert s.resumed_turns == 2 and s.ttft_p50_s == 0.5 and s.prompt_per_turn == 1220
    assert summarize("host", recs, recs).resumed_turns == 4
    with pytest.raises(ValueError, match="resumed_from"):
        summarize("x", recs, recs, resumed_from=0)


def test_run_sessions_resumes_from_another_servers_records(monkeypatch):
    """The restart arm's second server continues each session's history from the first server's answers: the
    prompts equal those of one uninterrupted run."""
    from k3_sglang.tooling.bench import session_traffic

    sent = []

    def fake_generate(url, ids, n):
        sent.append((url, list(ids)))
        return TurnRecord(0, 0, len(ids), 0, {}, 0.1, 0.2, tuple(ids[-n:]))  # answer: the prompt's last ids

    monkeypatch.setattr(session_traffic, "generate", fake_generate)
    traffic = SessionTraffic(sessions=2, first_tokens=20, tool_tokens=3, output_tokens=2, turns=3)
    whole = session_traffic.run_sessions("a", traffic)
    whole_prompts = [ids for _, ids in sent]
    sent.clear()
    before = session_traffic.run_sessions("a", traffic, turns=range(2))
    after = session_traffic.run_sessions("b", traffic, turns=range(2, 3), earlier=before)
    assert [ids for _, ids in sent] == whole_prompts and [u for u, _ in sent[-2:]] == ["b", "b"]
    assert [(r.session, r.turn, r.output_ids) for r in before + after] == [
        (r.session, r.turn, r.output_ids) for r in whole]
    with pytest.raises(ValueError, match="no earlier record"):
        session_traffic.run_sessions("b", traffic, turns=range(2, 3), earlier=before[:3])


def test_an_aborted_request_fails_the_bench_instead_of_passing_as_an_answer(monkeypatch):
    """SGLang answers a prompt longer than the KV pool with a finished stream whose finish_reason is `abort`: the
    bench must raise, not time a one-token "answer"."""
    import io
    import json as _json

    from k3_sglang.tooling.bench import session_traffic

    chunk = {"output_ids": [7], "meta_info": {"cached_tokens": 0, "finish_reason": {
        "type": "abort", "message": "Input length (1500 tokens) exceeds the maximum allowed length (1018 tokens)."}}}
    body = f"data: {_json.dumps(chunk)}\n\ndata: [DONE]\n".encode()
    monkeypatch.setattr(session_traffic.urllib.request, "urlopen", lambda req, timeout: io.BytesIO(body))
    with pytest.raises(RuntimeError, match="aborted .1500 prompt tokens.: Input length"):
        session_traffic.generate("http://127.0.0.1:1", [1] * 1500, 8)
