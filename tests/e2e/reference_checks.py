"""Prompts and comparisons shared by the end-to-end checks against the float64 reference (both K3 models)."""
from __future__ import annotations

import httpx
import torch

CHUNK = 64  # the servers' --chunked-prefill-size in these checks: the last prompt crosses chunk boundaries
REFERENCE_NEW_TOKENS = 32
# Teacher-forced logprobs of a float32 server against the float64 reference; a position whose reference MoE routing
# is a near-tie (k-th vs (k+1)-th biased expert score within NEAR_TIE) may route differently under float32 rounding
# and is counted and reported instead of checked.
LOGPROB_TOLERANCE = 2e-3
NEAR_TIE = 1e-3


def reference_prompts() -> list[list[int]]:
    """Three prompts (7, 45 and 2 * CHUNK + 37 tokens)."""
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, 760, (n,), generator=gen).tolist() for n in (7, 45, 2 * CHUNK + 37)]


def generate(url: str, ids: list[int], new_tokens: int, **extra) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
            **extra}
    resp = httpx.post(url + "/generate", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    return resp.json()


def logprob_report(url: str, reference, ids: list[int]) -> tuple[float, int, int]:
    """Teacher-forced input logprobs of `ids` from the server at url against the reference.

    Returns (largest |served - reference| over positions that are not near-ties, near-tie positions, positions).
    NaN anywhere in the served logprobs gives an infinite error."""
    meta = generate(url, ids, 1, return_logprob=True, logprob_start_len=0)["meta_info"]
    got = torch.tensor([lp for lp, _tok, *_ in meta["input_token_logprobs"][1:]], dtype=torch.float64)
    if torch.isnan(got).any():
        return float("inf"), 0, len(got)
    logp = torch.log_softmax(reference.logits(ids), dim=-1)
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert got.shape == want.shape
    ties = reference.routing_margins(ids)[: len(ids) - 1] < NEAR_TIE
    err = (got - want).abs()[~ties]
    return (err.max().item() if err.numel() else 0.0), int(ties.sum()), len(got)
