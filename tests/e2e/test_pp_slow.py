"""Pipeline prefill of 4K-16K-token prompts (slow: `make test-slow`): PP2 and PP4 against PP1, one server at a time.

Each prompt is prefilled in 1,024-token chunks (4-16 chunks streaming through the stages); the greedy output must
equal PP1's and the teacher-forced logprobs of all prompt and output positions agree within 1e-4. The default
run's test_pp_serve.py does the same at 700-3,000 tokens. TP2 x PP2 (4 ranks on 2 cores; the 4K prompt only) must
equal TP2 alone: greedy tokens (also equal to PP1's) and logprobs within 1e-4 (TP2's own logprobs differ from PP1's
by more, from the sharded reductions; that is TP's business, not the pipeline's).
"""
from __future__ import annotations

import os

import httpx
import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]
LENGTHS = (4096, 16384)
NEW_TOKENS = 16
FLAGS = ["--dtype", "float32", "--chunked-prefill-size", "1024", "--max-total-tokens", "20480"]


def _prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 760, (n,), generator=gen).tolist()


def _outputs(tiny_dir, log, extra: list[str], lengths=LENGTHS) -> dict[int, tuple[list[int], torch.Tensor]]:
    server = K3ServerProcess(["--model-path", str(tiny_dir), *FLAGS, *extra], log)
    server.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))
    try:
        out = {}
        for n in lengths:
            resp = httpx.post(server.url + "/generate", timeout=3000, json={
                "input_ids": _prompt(n, n), "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}})
            assert resp.status_code == 200, resp.text[:500]
            body = resp.json()
            meta = body["meta_info"]
            lps = [lp for lp, *_ in meta["input_token_logprobs"][1:]] + [lp for lp, *_ in meta["output_token_logprobs"]]
            out[n] = (body["output_ids"], torch.tensor(lps, dtype=torch.float64))
        return out
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pp1(tiny_dir, tmp_path_factory):
    return _outputs(tiny_dir, tmp_path_factory.mktemp("pp1") / "serve.log", [])


@pytest.mark.parametrize("pp_size", [2, 4])
def test_long_prompts_through_the_pipeline_match_pp1(pp1, tiny_dir, tmp_path, pp_size):
    got = _outputs(tiny_dir, tmp_path / "serve.log", ["--pp-size", str(pp_size)])
    for n in LENGTHS:
        assert got[n][0] == pp1[n][0], f"{n}-token prompt: greedy output differs"
        assert not torch.isnan(got[n][1]).any() and got[n][1].shape == pp1[n][1].shape
        diff = (got[n][1] - pp1[n][1]).abs().max().item()
        print(f"PP{pp_size} {n} tokens: max |logprob - PP1| = {diff:.2e}")
        assert diff < 1e-4



def test_tp2_x_pp2_equals_tp2(pp1, tiny_dir, tmp_path):
    tp2 = _outputs(tiny_dir, tmp_path / "tp2.log", ["--tp-size", "2"], lengths=(4096,))[4096]
    got = _outputs(tiny_dir, tmp_path / "tp2pp2.log", ["--tp-size", "2", "--pp-size", "2"], lengths=(4096,))[4096]
    log = (tmp_path / "tp2pp2.log").read_text()
    assert "PP1 TP1] K3 pipeline stage: layers [4, 9)" in log and "PP0 TP1] K3 pipeline stage: layers [0, 4)" in log
    assert got[0] == tp2[0] == pp1[4096][0], "4096-token prompt: greedy output differs"
    assert not torch.isnan(got[1]).any() and got[1].shape == tp2[1].shape
    diff = (got[1] - tp2[1]).abs().max().item()
    print(f"TP2xPP2 4096 tokens: max |logprob - TP2| = {diff:.2e}, TP2 vs PP1: "
          f"{(tp2[1] - pp1[4096][1]).abs().max().item():.2e}")
    assert diff < 1e-4
