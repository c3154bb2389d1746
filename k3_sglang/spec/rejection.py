"""Speculative sampling's acceptance rule for verified chains (pure torch; Leviathan et al. 2023, Chen et al. 2023).

A chain of request b holds its root and n_b - 1 drafted tokens x_1..x_{n_b-1}; the target's forward over the chain
gives, after row j (the root, then x_1..x_j), the distribution p_j of the next token after the request's sampling
transforms (temperature, top-k, top-p, min-p: spec/sampled_verify.py builds it as SGLang's sampler does). With q_j
the distribution the drafter drew x_{j+1} from:

- x_{j+1} is accepted with probability min(1, p_j(x_{j+1}) / q_j(x_{j+1})), in order, until the first rejection;
- at the first rejection (row j) the emitted token is drawn from the residual normalize(max(p_j - q_j, 0));
- when every draft is accepted, a bonus token is drawn from p at the last row.

Each emitted token is then distributed exactly as plain sampling from p would draw it, whatever q is (the lossless
property here is distributional; tests/spec/test_rejection.py checks it by a chi-square test). K3_CSV's drafters
(prompt lookup, controlled replay) are deterministic: q_j is a point mass on the drafted token, so the draft is
accepted with probability p_j(x) and the residual is p_j with x removed. `draft_probs` takes a general q for
drafters that sample (a draft model).

Randomness comes in as uniforms in [0, 1) so that the rule itself is a pure function: accept coins [B, L - 1] (one
per draft) and one final coin [B] for the residual or bonus draw (inverse CDF). `request_coins` makes them from
per-request seeds (a torch.Generator per request seeded by (seed, committed length), so a seeded request draws the
same coins at the same position whatever batch it is in) or from the global generator for unseeded requests.
"""
from __future__ import annotations

import torch

_MAX_COIN = 1.0 - 2.0 ** -24  # the largest float32 below 1: a coin of 1.0 would walk past the last CDF bucket
_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant mixing (seed, position) into one generator seed


def sample_inverse_cdf(weights: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """weights [N, V] >= 0 (unnormalised, each row with positive mass), coins [N] in [0, 1) -> tokens [N] int64.

    Token v is drawn with probability weights[v] / sum(weights); a zero-weight token is never drawn."""
    cdf = torch.cumsum(weights.to(torch.float64), dim=-1)
    target = coins.to(torch.float64).clamp(0.0, _MAX_COIN) * cdf[:, -1]
    idx = torch.searchsorted(cdf, target[:, None], right=True)[:, 0]
    return idx.clamp_(max=weights.shape[-1] - 1)


def speculative_sample(target_probs: torch.Tensor, draft_tokens: torch.Tensor, verify_lens: torch.Tensor,
                       accept_coins: torch.Tensor, final_coins: torch.Tensor,
                       draft_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance rule over a batch of chains (module docstring).

    target_probs [B, L, V]: p after each chain row (row j = root + j drafts; rows past n_b - 1 are ignored);
    draft_tokens [B, L - 1] int: x_{j+1} at column j (columns >= n_b - 1 ignored); verify_lens [B] int: n_b in
    [1, L]; accept_coins [B, L - 1] and final_coins [B]: uniforms in [0, 1); draft_probs [B, L - 1, V] or None for
    point-mass drafts (q_j = one-hot of x_{j+1}).

    Returns (commit_lens [B] int64 = accepted drafts + 1, out_tokens [B, L] int64: the accepted drafts, then the
    token drawn from the residual or, when all were accepted, the bonus token from p at row n_b - 1; columns past
    commit_len - 1 are 0)."""
    bs, width, vocab = target_probs.shape
    if draft_tokens.shape != (bs, width - 1) or accept_coins.shape != (bs, width - 1):
        raise ValueError(f"speculative_sample: drafts {tuple(draft_tokens.shape)} and coins "
                         f"{tuple(accept_coins.shape)} for target_probs {tuple(target_probs.shape)}")
    p = target_probs  # only the gathered entries and rows are taken to float64 (no [B, L, V] float64 copy)
    lens = verify_lens.to(torch.int64).view(bs)
    drafts = draft_tokens.to(torch.int64).clamp(0, vocab - 1)
    p_draft = torch.gather(p[:, : width - 1], 2, drafts[:, :, None])[:, :, 0].to(torch.float64)  # p_j(x_{j+1})
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = torch.gather(draft_probs, 2, drafts[:, :, None])[:, :, 0].to(torch.float64)
    # accept with probability min(1, p/q): u < p/q, i.e. u * q < p (q = 0 means the drafter could not draw x)
    accepted = accept_coins.to(torch.float64) * q_draft < p_draft
    valid = torch.arange(width - 1, device=lens.device)[None, :] < (lens[:, None] - 1)
    n_accepted = torch.cumprod((accepted & valid).to(torch.int64), dim=1).sum(dim=1)  # leading accepts [B]
    rows = torch.arange(bs, device=lens.device)
    p_at = p[rows, n_accepted].to(torch.float64)  # [B, V] p at the first rejected row, or at the last row (bonus)
    rejected = n_accepted < lens - 1
    if bool(rejected.any()):
        at = n_accepted.clamp(max=width - 2)
        if draft_probs is None:
            q_at = torch.zeros_like(p_at)
            q_at[rows, drafts[rows, at]] = 1.0
        else:
            q_at = draft_probs[rows, at].to(torch.float64)
        residual = (p_at - q_at).clamp_(min=0.0)
        # an empty residual needs p == q, which accepts surely: only rounding gets here, and p is then the answer
        empty = residual.sum(dim=-1) <= 0
        residual = torch.where(empty[:, None], p_at, residual)
        p_at = torch.where(rejected[:, None], residual, p_at)
    last = sample_inverse_cdf(p_at, final_coins)
    cols = torch.arange(width, device=lens.device)[None, :]
    out = torch.where(cols < n_accepted[:, None], torch.nn.functional.pad(drafts, (0, 1)), 0)
    out[rows, n_accepted] = last
    return n_accepted + 1, out


def request_coins(seeds: list[int | None], seq_lens: list[int], width: int,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform coins for one verify step: (accept_coins [B, width - 1], final_coins [B]) float64 in [0, 1).

    A request with a seed draws from its own torch.Generator seeded by (seed, committed length seq_lens[b]), so its
    coins depend only on its seed and position; one without draws from `generator` (the global one if None)."""
    accept = torch.empty(len(seeds), width - 1, dtype=torch.float64)
    final = torch.empty(len(seeds), dtype=torch.float64)
    for b, (seed, pos) in enumerate(zip(seeds, seq_lens)):
        gen = generator
        if seed is not None:
            gen = torch.Generator().manual_seed(((int(seed) * _SEED_MIX) ^ int(pos)) & ((1 << 63) - 1))
        coins = torch.rand(width, dtype=torch.float64, generator=gen)
        accept[b], final[b] = coins[: width - 1], coins[width - 1]
    return accept, final
