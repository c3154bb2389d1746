"""Pipeline-parallel serving of the tiny K3 (float32) on SGLang's own K3 and PP scheduler: `--pp-size 2` and a PP4
smoke run against the one-rank server of conftest.py (same chunking, same pool).

Chunked pipeline prefill of a 3,000-token prompt in 64-token chunks streams ~47 chunks through the stages, the
AttnRes bank crossing every boundary; greedy output must equal PP1's token for token and the teacher-forced
logprobs of every prompt and output position agree within 1e-4 (the ranks run 1 thread each, PP1 two, so GEMM
reduction order may differ).
The PP4 run uses SGLANG_PP_LAYER_PARTITION=3,1,3,2: stages with no MLA layer ([0,3), [4,7)) and with no KDA
layer ([3,4), [7,9)), so SGLang builds zero-layer pools on some ranks.
"""
from __future__ import annotations

import concurrent.futures
import os

import pytest

from k3_sglang.serving.process import K3ServerProcess
from tests.e2e.parallel_checks import generate as _generate
from tests.e2e.parallel_checks import prompt as _prompt
from tests.e2e.parallel_checks import prompt_logprobs as _logprobs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
# The flags of conftest.py's `server` (PP1): the comparison needs the same chunks and pool.
SAME_AS_PP1 = ["--dtype", "float32", "--chunked-prefill-size", "64", "--max-total-tokens", "8192"]
LOGPROB_TOL = 1e-4


def _start(tiny_dir, tmp_path_factory, name: str, extra: list[str], env: dict[str, str]) -> K3ServerProcess:
    log = tmp_path_factory.mktemp(name) / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), *SAME_AS_PP1, *extra], log, env={"K3_MAX_N": "16", **env})
    return proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))


@pytest.fixture(scope="module")
def pp2_server(tiny_dir, tmp_path_factory):
    proc = _start(tiny_dir, tmp_path_factory, "serve-pp2", ["--pp-size", "2"], {})  # SGLang's default split: 4,5
    yield proc
    proc.stop()


def _assert_same_as_pp1(pp1, ppn, ids: list[int], new_tokens: int) -> None:
    want, got = _generate(pp1, ids, new_tokens, True), _generate(ppn, ids, new_tokens, True)
    assert got["output_ids"] == want["output_ids"]
    assert len(got["output_ids"]) == new_tokens
    diff = (_logprobs(got) - _logprobs(want)).abs().max().item()
    assert diff < LOGPROB_TOL, f"teacher-forced logprobs differ by {diff:.2e}"


def test_pp2_long_prompt_is_lossless(server, pp2_server):
    _assert_same_as_pp1(server, pp2_server, _prompt(3000, 7), 24)


def test_pp2_batched_prompts_and_a_prefix_cache_hit_match_pp1(server, pp2_server):
    prompts = [_prompt(n, 30 + n) for n in (2600, 40, 700, 5)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: _generate(pp2_server, ids, 12)["output_ids"], prompts))
    for ids, out in zip(prompts, got):
        assert out == _generate(server, ids, 12)["output_ids"]
    first = _prompt(2200, 8)
    answer = _generate(pp2_server, first, 8)["output_ids"]
    follow_up = first + answer + _prompt(300, 9)
    out = _generate(pp2_server, follow_up, 12)
    assert out["meta_info"]["cached_tokens"] >= 2048  # every stage restored its own KV and KDA state
    assert out["output_ids"] == _generate(server, follow_up, 12)["output_ids"]


def test_pp2_ranks_each_run_their_stage(pp2_server):
    log = pp2_server.log_path.read_text()
    assert "PP1] Prefill batch" in log and "PP0] Prefill batch" in log


@pytest.mark.slow  # PP2 stays in the default run
def test_pp4_with_stages_lacking_mla_or_kda_matches_pp1(server, tiny_dir, tmp_path_factory):
    pp4 = _start(tiny_dir, tmp_path_factory, "serve-pp4", ["--pp-size", "4"],
                 {"SGLANG_PP_LAYER_PARTITION": "3,1,3,2", "SGLANG_CPU_OMP_THREADS_BIND": "0|1|0|1"})
    try:
        _assert_same_as_pp1(server, pp4, _prompt(700, 12), 12)
        log = pp4.log_path.read_text()
    finally:
        pp4.stop()
    assert all(f"PP{rank}] Prefill batch" in log for rank in range(4))
