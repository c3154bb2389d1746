"""The compare report (`k3 bench serve --model-impl compare`): per-round ratios (SGLang's K3's time over the portable model's) and issue 37's <= 1.0 verdict."""
from __future__ import annotations

import types

from k3_sglang.tooling.bench.serve_models_report import per_round_ratios, report


def test_ratio_is_portable_throughput_over_sglang_per_round_and_every_round_must_meet_the_goal():
    results = {"portable": {"prefill": [100.0, 200.0], "decode1": [10.0, 10.0], "decodeN": [50.0, 40.0]},
               "sglang": {"prefill": [200.0, 100.0], "decode1": [20.0, 12.5], "decodeN": [25.0, 80.0]}}
    assert per_round_ratios(results, "prefill") == [0.5, 2.0]
    args = types.SimpleNamespace(prefill_tokens=2048, batch=16, new_tokens=64, repeats=2, profile=False, serve_args=[])
    text = report(args, results, [])
    assert "prefill, 2048-token prompt (tok/s): 100.0 / 200.0, 200.0 / 100.0; ratio 0.50, 2.00 (not met)" in text
    assert "decode, batch 1 (tok/s): 10.0 / 20.0, 10.0 / 12.5; ratio 0.50, 0.80 (met)" in text
    assert "decode, batch 16 (tok/s): 50.0 / 25.0, 40.0 / 80.0; ratio 2.00, 0.50 (not met)" in text
    results["sglang"]["decode1"] = [5.0, 10.0]
    assert "ratio 2.00, 1.00 (not met)" in report(args, results, [])
