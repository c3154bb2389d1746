"""Shared checks of the parallel (TP, DCP, PP) end-to-end tests: greedy identity and teacher-forced logprobs against
the one-rank server, and accuracy against the float64 reference forward.

Tolerance: on the random tiny K3 in float32, TP1 itself is up to ~1e-3 away from the float64 reference at a few
positions of a 2K-token prompt (median ~5e-6). A TP/DCP run sums the same products in another order, so its
distance from TP1 has the same heavy tail; the check is therefore two-sided: the median distance to TP1 stays below
1e-5 and the parallel run is as close to the float64 reference as TP1 is (its max error at most 1.5x TP1's plus
1e-4), which fails for any wrong head, stripe or merge.
"""
from __future__ import annotations

import concurrent.futures
import os

import httpx
import torch

MEDIAN_TOL = 1e-5


def start_k3(tiny_dir, tmp_path_factory, name: str, args: list[str], env: dict | None = None,
             timeout_s: float = 600.0):
    """A `k3 serve` of the tiny checkpoint with `args` (K3_MAX_N=16 plus `env`), its log in a fresh tmp folder;
    K3_TEST_STARTUP_S overrides the startup timeout."""
    from k3_sglang.serving.process import K3ServerProcess

    log = tmp_path_factory.mktemp(name) / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), *args], log, env={"K3_MAX_N": "16", **(env or {})})
    return proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", timeout_s)))


def prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 760, (n,), generator=gen).tolist()


def generate(server, ids: list[int], new_tokens: int, logprobs: bool = False, output_logprobs: bool = False) -> dict:
    """Greedy /generate; logprobs: of every prompt and output token (no prefix-cache hit: SGLang recomputes what
    it must score); output_logprobs: of the output tokens only (a prefix hit stays a hit)."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    if logprobs:
        body.update(return_logprob=True, logprob_start_len=0)
    elif output_logprobs:
        body.update(return_logprob=True, logprob_start_len=len(ids) - 1)
    resp = httpx.post(server.url + "/generate", json=body, timeout=1200)
    assert resp.status_code == 200, resp.text[:500]
    return resp.json()


def prompt_logprobs(out: dict) -> torch.Tensor:
    """Teacher-forced logprobs of prompt positions 1.. and of every generated token, float64; NaN fails."""
    meta = out["meta_info"]
    values = [lp for lp, *_ in meta["input_token_logprobs"][1:]] + [lp for lp, *_ in meta["output_token_logprobs"]]
    got = torch.tensor(values, dtype=torch.float64)
    assert not torch.isnan(got).any()
    return got


def reference_logprobs(reference, ids: list[int]) -> torch.Tensor:
    """float64 log p(ids[i] | ids[:i]) for i >= 1."""
    logits = reference.logits(ids)
    return torch.log_softmax(logits[:-1], dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def assert_matches_tp1(tp1, other, reference, ids: list[int], new_tokens: int) -> dict[str, float]:
    """Greedy identical to TP1; logprobs as described in the module docstring. Returns the measured figures."""
    want, got = generate(tp1, ids, new_tokens, True), generate(other, ids, new_tokens, True)
    assert got["output_ids"] == want["output_ids"], "greedy output differs from TP1"
    assert len(got["output_ids"]) == new_tokens
    a, b = prompt_logprobs(want), prompt_logprobs(got)
    diff = (a - b).abs()
    figures = {"vs_tp1_median": diff.median().item(), "vs_tp1_max": diff.max().item()}
    assert figures["vs_tp1_median"] < MEDIAN_TOL, figures
    exact = reference_logprobs(reference, ids + want["output_ids"][:-1])
    n = exact.shape[0]
    figures["tp1_vs_f64_max"] = (a[:n] - exact).abs().max().item()
    figures["vs_f64_max"] = (b[:n] - exact).abs().max().item()
    assert figures["vs_f64_max"] <= 1.5 * figures["tp1_vs_f64_max"] + 1e-4, figures
    return figures


def assert_concurrent_match(tp1, other, count: int = 8, new_tokens: int = 8) -> None:
    """`count` different prompts sent at once: every greedy output equals TP1's."""
    prompts = [prompt(300 + 41 * i, 500 + i) for i in range(count)]
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        got = list(pool.map(lambda ids: generate(other, ids, new_tokens)["output_ids"], prompts))
    for ids, out in zip(prompts, got):
        assert out == generate(tp1, ids, new_tokens)["output_ids"]


def logical_kv_tokens(server) -> int:
    resp = httpx.get(server.url + "/get_server_info", timeout=30)
    assert resp.status_code == 200
    return int(resp.json()["max_total_num_tokens"])


def assert_prefix_hits_match(tp1, proc) -> None:
    """Radix-cache hits on `proc` give TP1's greedy tokens and output logprobs (within 1e-4), for both kinds of KDA
    state snapshot a hit restores (under DCP: SGLang's extra_buffer track slots, written by model/kda_snapshot.py):
    - one a decode step left: the first turn's decode crosses 1024 (SGLang's decode track interval is 256), so the
      follow-up turn's hit reaches past the first prompt;
    - one from inside an extend: two prompts share 650 tokens then diverge; the second hits a track boundary at or
      below 650 and adds only 4 tokens after it (few enough that a stale state changes the tokens).
    Prompts differ from every other check's, so nothing else primes the cache."""
    first = prompt(1020, 12)
    out = generate(proc, first, 8)["output_ids"]
    assert out == generate(tp1, first, 8)["output_ids"]
    follow = first + out + prompt(4, 13)
    again, want = generate(proc, follow, 8, output_logprobs=True), generate(tp1, follow, 8, output_logprobs=True)
    assert len(first) < again["meta_info"]["cached_tokens"] < len(follow), again["meta_info"]
    assert_same_output(again, want)

    shared = prompt(650, 14)
    a, b = shared + prompt(90, 15), shared + prompt(4, 16)
    assert generate(proc, a, 8)["output_ids"] == generate(tp1, a, 8)["output_ids"]
    hit, want = generate(proc, b, 8, output_logprobs=True), generate(tp1, b, 8, output_logprobs=True)
    assert 0 < hit["meta_info"]["cached_tokens"] <= len(shared), hit["meta_info"]
    assert_same_output(hit, want)


def assert_same_output(out: dict, ref: dict, tol: float = 1e-4) -> None:
    """Same greedy tokens and output logprobs within tol (NaN fails)."""
    assert out["output_ids"] == ref["output_ids"]
    got, want = ([lp for lp, *_ in o["meta_info"]["output_token_logprobs"]] for o in (out, ref))
    gap = max(abs(x - y) for x, y in zip(got, want))
    print(f"prefix hit: {out['meta_info']['cached_tokens']} cached, max output logprob gap {gap:.2e}")
    assert len(got) == len(want) > 0 and gap < tol, (got, want)
