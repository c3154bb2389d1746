"""Greedy acceptance of verified chains (pure torch)."""
from __future__ import annotations

import torch


def accept_greedy(predicted: torch.Tensor, tokens: torch.Tensor, verify_lens: list[int]) -> tuple[list[int], list[list[int]]]:
    """predicted [T] the target's argmax after each packed row; tokens [T] the packed rows (root, drafts...).

    Request b owns rows qo[b]:qo[b+1] = (root, d_1, ..., d_{L-1}); d_j is accepted while it equals the target's
    prediction after the row before it. Returns (commit_lens [B] = accepted drafts + 1, out_tokens per request =
    the accepted drafts then the bonus token, i.e. predicted[qo[b] : qo[b] + commit_len])."""
    pred, toks = predicted.tolist(), tokens.tolist()
    commit_lens, outs, at = [], [], 0
    for n in verify_lens:
        c = 0
        while c + 1 < n and toks[at + c + 1] == pred[at + c]:
            c += 1
        commit_lens.append(c + 1)
        outs.append(pred[at: at + c + 1])
        at += n
    return commit_lens, outs
