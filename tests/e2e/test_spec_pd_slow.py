"""K3_CSV on a PD decode server (slow: three SGLang servers on 2 cores).

The prefill server runs without speculation; the decode server runs K3_CSV, whose first decode batch after the
KV transfer gets its draft state from `K3SpecAlgo.build_disagg_draft_input` (the committed lengths and the bonus
token: the drafter reads the request's own context, so nothing else crosses). Greedy output through router ->
prefill -> decode must equal the aggregated no-spec server, with verify steps on the decode side. The second case
runs the prefill server as a PP2 pipeline (K3_CSV's PP composition: PP prefill, speculation on the decode server).
The model is SGLang's own K3 on k3_cpu: its KV pages and KDA state cross over Mooncake as SGLang's hybrid
disaggregation sends them.
"""
from __future__ import annotations

import concurrent.futures
import json
import os

import pytest

from k3_sglang.net import free_port
from k3_sglang.serving.process import K3ServerProcess
from test_pd_serve import ADMIN_KEY, SAME_AS_AGGREGATED, _generate, _prompt, _start_router

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]


PROMPT_SIZES = (30, 250, 700)


@pytest.mark.parametrize("prefill_flags", [[], ["--pp-size", "2"]], ids=["prefill-tp1", "prefill-pp2"])
def test_pd_decode_with_k3_csv_matches_aggregated(server, tiny_dir, tmp_path, prefill_flags):
    prompts = [_prompt(n, 900 + n) for n in PROMPT_SIZES]
    _pd_with_k3_csv(tiny_dir, tmp_path, prefill_flags, prompts,
                    [_generate(server.url, p, 24).json()["output_ids"] for p in prompts])


def _pd_with_k3_csv(tiny_dir, tmp_path, prefill_flags, prompts, want, env=None):
    bootstrap = free_port()
    common = ["--model-path", str(tiny_dir), *SAME_AS_AGGREGATED]
    record = tmp_path / "steps.jsonl"
    prefill = K3ServerProcess(common + prefill_flags + ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                                        str(bootstrap)], tmp_path / "prefill.log", env=env)
    decode = K3ServerProcess(common + ["--disaggregation-mode", "decode", "--speculative-algorithm", "K3_CSV"],
                             tmp_path / "decode.log",
                             env={**(env or {}), "K3_SPEC_FORCE_VERIFY_LEN": "4", "K3_SPEC_RECORD": str(record)})
    router = None
    startup = float(os.environ.get("K3_TEST_STARTUP_S", "600"))
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(timeout_s=startup), (prefill, decode)))
        router, url = _start_router(["--prefill", prefill.url, str(bootstrap), "--decode", decode.url,
                                     "--admin-key", ADMIN_KEY], tmp_path / "router.log")
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda p: _generate(url, p, 24).json()["output_ids"], prompts))
        assert got == want
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=10)
        prefill.stop()
        decode.stop()
    steps = [json.loads(line) for line in record.read_text().splitlines()]
    assert any(s["kind"] == "verify" for s in steps)
