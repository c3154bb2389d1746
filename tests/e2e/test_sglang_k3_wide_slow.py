"""SGLang's own K3 on CPU at the widths the portable model served (slow: `make test-slow`;
about 19 min on 2 cores; one server at a time).

Each width runs on gloo ranks against SGLang's K3 at TP1 on the same checkpoint, same chunks (64 tokens), same
per-rank pool: a 700-token prompt (11 chunks) whose greedy output must be token-identical to TP1's and whose
teacher-forced logprobs of every prompt and output position stay within float32 reduction-order noise of TP1's
(median below 1e-5, max below 2e-3: a wrong head, expert, stripe, stage or merge moves them by far more), four
different prompts sent at once (each TP1's tokens), and under DCP N, N x TP1's logical KV on the same per-rank pool.

TP4 x EP4 x DCP4 (one server: 1 KDA and 1 MLA head and 2 of the 8 routed experts per rank, the KV striped four ways,
SGLang's a2a merge) and PP4 with stages lacking MLA or KDA (SGLANG_PP_LAYER_PARTITION=3,1,3,2), on the embedded
k3-tiny (4 KDA and 4 MLA heads). The TP1 answers are taken first and its server stopped, so one server runs at a
time. Width 8 (TP/EP/DCP 8 on k3-tiny-8h, whose 8 heads split 8 ways) is not served yet on SGLang's K3 on CPU:
sglang_cpu_limits.py refuses it.
"""
from __future__ import annotations

import concurrent.futures
import os

import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.parallel_checks import generate, logical_kv_tokens, prompt, prompt_logprobs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]
POOL = 8192
FLAGS = ["--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", str(POOL),
         "--mem-fraction-static", "0.98"]
STARTUP_S = float(os.environ.get("K3_TEST_STARTUP_S", "1500"))  # eight ranks loading on two shared cores
LONG, NEW_TOKENS = prompt(700, 41), 12
BATCH = [prompt(n, 70 + n) for n in (5, 45, 130, 300)]


def _serve(ckpt, log, extra: list[str], env: dict[str, str] | None = None) -> K3ServerProcess:
    return K3ServerProcess(["--model-path", str(ckpt), *FLAGS, *extra], log,
                           env={"K3_MAX_N": "16", **(env or {})}).start(timeout_s=STARTUP_S)


def _answers(server) -> dict:
    """The long prompt's greedy tokens and logprobs, the batch's greedy tokens sent at once, the logical KV."""
    long = generate(server, LONG, NEW_TOKENS, logprobs=True)
    with concurrent.futures.ThreadPoolExecutor(len(BATCH)) as pool:
        batch = list(pool.map(lambda ids: generate(server, ids, 8)["output_ids"], BATCH))
    return {"tokens": long["output_ids"], "logprobs": prompt_logprobs(long), "batch": batch,
            "kv": logical_kv_tokens(server)}


def _tp1_answers(ckpt, tmp_path_factory, name: str) -> dict:
    server = _serve(ckpt, tmp_path_factory.mktemp(name) / "serve.log", [])
    try:
        return _answers(server)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tiny_tp1(tiny_dir, tmp_path_factory):
    return _tp1_answers(tiny_dir, tmp_path_factory, "sglang-k3-tp1")


def _assert_matches(want: dict, got: dict, dcp: int) -> None:
    assert got["tokens"] == want["tokens"] and len(got["tokens"]) == NEW_TOKENS, "greedy output differs from TP1"
    diff = (got["logprobs"] - want["logprobs"]).abs()
    figures = {"median": diff.median().item(), "max": diff.max().item()}
    print("teacher-forced logprobs vs TP1:", {k: f"{v:.2e}" for k, v in figures.items()})
    assert figures["median"] < 1e-5 and figures["max"] < 2e-3, figures
    assert got["batch"] == want["batch"], "concurrent requests differ from TP1"
    assert got["kv"] == dcp * want["kv"] == dcp * POOL


WIDTHS = {
    "tp4-ep4-dcp4": (["--tp-size", "4", "--ep-size", "4", "--dcp-size", "4", "--dcp-comm-backend", "a2a"], {}, 4),
    "pp4": (["--pp-size", "4"], {"SGLANG_PP_LAYER_PARTITION": "3,1,3,2"}, 1),
}


@pytest.mark.parametrize("name", list(WIDTHS))
def test_four_wide_matches_tp1(tiny_tp1, tiny_dir, tmp_path, name):
    extra, env, dcp = WIDTHS[name]
    server = _serve(tiny_dir, tmp_path / "serve.log", extra, env)
    try:
        got = _answers(server)
    finally:
        server.stop()
    _assert_matches(tiny_tp1, got, dcp)
    if name == "pp4":  # SGLang built zero-layer pools on the stages without MLA ([0, 3), [4, 7)) or KDA
        log = (tmp_path / "serve.log").read_text()
        assert "PP3] Prefill batch" in log and "PP0] Prefill batch" in log


def test_the_answers_are_not_degenerate(tiny_tp1):
    """The checks above compare against TP1: TP1 itself must answer finite logprobs and varied tokens."""
    assert torch.isfinite(tiny_tp1["logprobs"]).all()
    assert len(set(tiny_tp1["tokens"])) > 1 and all(len(b) == 8 for b in tiny_tp1["batch"])
