"""Sampled verification for K3_CSV: SGLang's sampling transforms on the verify logits, then the rejection rule.

The target distribution of a verified row is what SGLang's sampler would draw the next token from in a plain
decode step, built with SGLang's own helpers: `sglang.kernels.ops.sampling.softmax` with the request's
temperature, then, when the batch needs top-k / top-p / min-p, the filter of the server's sampling backend: for
`pytorch` (CPU serving's) that backend's own `top_k_top_p_min_p_sampling_from_probs_torch`; for `flashinfer`
SGLang's renorm kernels, as its EAGLE verify uses them (min-p after them, as its flashinfer sampler applies it).
Another backend (a registered custom sampler, Ascend's) is not mirrored: its batches decode plainly.
Greedy requests of a mixed batch (top_k <= 1) keep greedy acceptance on the raw logits, token for token.
"""
from __future__ import annotations

import torch

from k3_sglang.spec.accept import accept_greedy
from k3_sglang.spec.rejection import request_coins, speculative_sample


def current_sampling_backend() -> str | None:
    """The serving process's `--sampling-backend` (None outside an SGLang server process)."""
    from sglang.srt.runtime_context import get_exec

    try:
        return get_exec().kernel.sampling_backend
    except ValueError:  # SGLang's runtime context is not published: no server here
        return None


def backend_supported(backend: str | None) -> bool:
    """True when filtered_probs mirrors this sampling backend's transforms."""
    if backend == "pytorch":
        return True
    if backend == "flashinfer":
        from sglang.kernels.ops.sampling.renorm import top_k_renorm_prob, top_p_renorm_prob

        return top_k_renorm_prob is not None and top_p_renorm_prob is not None
    return False


def filtered_probs(logits: torch.Tensor, info, rows_per_request: torch.Tensor,
                   backend: str = "pytorch") -> torch.Tensor:
    """logits [T, V] (raw, packed request after request), info SGLang's SamplingBatchInfo of B requests,
    rows_per_request [B] int (sum T), backend the server's sampling backend (backend_supported) -> target
    probabilities [T, V] float32 (rows sum to 1)."""
    if not backend_supported(backend):
        raise ValueError(f"K3_CSV sampled verify: sampling backend {backend!r} is not mirrored")
    from sglang.kernels.ops.sampling import softmax as sampler_softmax

    def per_row(x: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(x, rows_per_request.to(x.device), dim=0)

    probs = sampler_softmax(logits.float(), temperatures=per_row(info.temperatures.view(-1, 1)).float())
    if not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling):
        return probs
    top_ks, top_ps, min_ps = per_row(info.top_ks), per_row(info.top_ps), per_row(info.min_ps)
    if backend == "flashinfer":
        from sglang.kernels.ops.sampling.renorm import top_k_renorm_prob, top_p_renorm_prob

        if info.need_top_k_sampling:
            probs = top_k_renorm_prob(probs, top_ks)
        if info.need_top_p_sampling:
            probs = top_p_renorm_prob(probs, top_ps)
        if info.need_min_p_sampling:
            probs = probs.masked_fill(probs < probs.max(dim=-1, keepdim=True).values * min_ps[:, None], 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    _, sorted_probs, sorted_idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs, top_ks, top_ps, min_ps, info.need_min_p_sampling, None, None, return_filtered_probs=True)
    kept = torch.zeros_like(probs).scatter_(-1, sorted_idx.long(), sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def accept_sampled(logits: torch.Tensor, tokens: torch.Tensor, verify_lens: list[int], reqs, info,
                   seq_lens: list[int], backend: str = "pytorch") -> tuple[list[int], list[list[int]]]:
    """logits [T, V] raw verify logits, tokens [T] the packed rows (root, drafts...) of B requests with
    verify_lens [B], reqs (their SGLang Reqs: sampling params and seeds), info their SamplingBatchInfo, seq_lens [B]
    committed lengths (the seeded coins' position), backend the server's sampling backend -> (commit_lens [B], out
    tokens per request), as accept_greedy.

    Sampled requests get the rejection rule with point-mass drafts; greedy ones (top_k <= 1) greedy acceptance. Only
    the sampled requests' rows are laid out as [B_sampled, L, V] target probabilities."""
    commit_lens, outs = accept_greedy(torch.argmax(logits, -1), tokens, verify_lens)
    sampled = [b for b, r in enumerate(reqs) if r.sampling_params.top_k > 1]
    if not sampled:
        return commit_lens, outs
    width = max(verify_lens[b] for b in sampled)
    lens_t = torch.tensor(verify_lens, dtype=torch.int64)
    probs = filtered_probs(logits, info, lens_t, backend)
    qo = [0]
    for n in verify_lens:
        qo.append(qo[-1] + n)
    grid = torch.zeros(len(sampled), width, probs.shape[-1], dtype=probs.dtype, device=probs.device)
    drafts = torch.zeros(len(sampled), width - 1, dtype=torch.int64)
    toks = tokens.cpu().to(torch.int64)
    for i, b in enumerate(sampled):
        n = verify_lens[b]
        grid[i, :n] = probs[qo[b]: qo[b + 1]]
        drafts[i, : n - 1] = toks[qo[b] + 1: qo[b + 1]]
    del probs
    accept_coins, final_coins = request_coins([reqs[b].sampling_params.sampling_seed for b in sampled],
                                              [seq_lens[b] for b in sampled], width)
    dev = grid.device
    commit, out = speculative_sample(grid, drafts.to(dev), lens_t[sampled].to(dev), accept_coins.to(dev),
                                     final_coins.to(dev))
    for i, b in enumerate(sampled):
        commit_lens[b] = int(commit[i])
        outs[b] = [int(t) for t in out[i, : commit_lens[b]]]
    return commit_lens, outs
