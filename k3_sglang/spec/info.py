"""The verify input of one K3_CSV step (what the model's layers read in TARGET_VERIFY).

A step verifies a chain per request: its root (the last committed token, whose KV is not written yet) followed by
verify_lens[b] - 1 drafts, packed request after request into T = sum(verify_lens) rows, described to SGLang as its
ragged verify layout (`ragged_verify_layout`, the per-request lengths every layer reads). MLA attends these rows as
an extend over the committed prefix (lower-right causal); KDA runs them as verify_lens[b] recurrent steps from the
slot's state into SGLang's per-draft scratch without writing the pool (spec/contract.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang.srt.speculative.ngram_info import NgramVerifyInput
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType


@dataclass(frozen=True)
class VerifyLayout:
    """Host-side layout of a verify batch: verify_lens [B] (>= 1 each), committed seq_lens [B]."""

    verify_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.verify_lens) != len(self.seq_lens) or not self.verify_lens:
            raise ValueError(f"VerifyLayout: {len(self.verify_lens)} verify lengths for {len(self.seq_lens)} requests")
        if min(self.verify_lens) < 1:
            raise ValueError(f"VerifyLayout: every request verifies its root (length >= 1), got {self.verify_lens}")

    @property
    def num_requests(self) -> int:
        return len(self.verify_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.verify_lens)

    @property
    def l_max(self) -> int:
        return max(self.verify_lens)

    def qo_indptr(self) -> list[int]:
        out = [0]
        for n in self.verify_lens:
            out.append(out[-1] + n)
        return out

    def valid(self) -> torch.Tensor:
        """[B, L_max] bool: step t of request b is part of its chain (t < verify_lens[b])."""
        return torch.arange(self.l_max)[None, :] < torch.tensor(self.verify_lens)[:, None]

    def positions(self) -> torch.Tensor:
        """[T] int64 absolute position of each packed row (seq_len + j)."""
        grid = torch.tensor(self.seq_lens, dtype=torch.int64)[:, None] + torch.arange(self.l_max)[None, :]
        return grid[self.valid()]

    def packed_index(self) -> torch.Tensor:
        """[T] int64: flat index into a [B, L_max] tensor of each packed row."""
        return self.valid().flatten().nonzero().flatten()


class K3DraftState(NgramVerifyInput):
    """SGLang's between-steps speculative state (the NGRAM worker's layout) plus bonus_tokens [B], each request's
    last committed token, which SGLang's pipeline relay sends to the earlier stages."""

    topk_p = None  # no draft model: the pipeline relay has no draft distribution or hidden states to send


def draft_state(width: int, new_seq_lens: torch.Tensor, accept_tokens: torch.Tensor, accept_lens: torch.Tensor,
                bonus_tokens: torch.Tensor) -> K3DraftState:
    """accept_tokens [B * width] (request b's committed tokens from column b * width), accept_lens [B],
    new_seq_lens [B], bonus_tokens [B] -> the state SGLang carries to the next step."""
    state = K3DraftState(draft_token_num=width, new_seq_lens=new_seq_lens, accept_tokens=accept_tokens,
                         accept_lens=accept_lens)
    state.bonus_tokens = bonus_tokens
    return state


def one_token_draft_state(width: int, new_seq_lens: torch.Tensor, tokens: torch.Tensor):
    """The state after a step that emitted one token per request (`tokens` [B]): the token in column 0 of
    accept_tokens [B * width], accept_lens all 1."""
    bs = tokens.shape[0]
    accept = torch.zeros(bs * width, dtype=torch.int32, device=tokens.device)
    accept[::width] = tokens
    return draft_state(width, new_seq_lens, accept, torch.ones(bs, dtype=torch.int32, device=tokens.device), tokens)


class K3VerifyInput(SpecInput):
    """SGLang's spec_info for a K3_CSV TARGET_VERIFY forward (a chain per request, no custom mask)."""

    def __init__(self, layout: VerifyLayout, draft_token_num: int, device: torch.device | str = "cpu"):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

        super().__init__(SpecInputType.NGRAM_VERIFY)
        self.layout = layout
        self.verify_lens = list(layout.verify_lens)
        self.draft_token_num = draft_token_num
        self.num_tokens_per_req = draft_token_num
        self.num_tokens_for_logprob_per_req = draft_token_num
        self.positions = layout.positions().to(device)
        self.packed_index = layout.packed_index().to(device)
        self.capture_hidden_mode = CaptureHiddenMode.NULL
        self.custom_mask = None
        # SGLang's hybrid linear backend reads query_start_loc from here for a ragged verify
        self.ragged_verify_layout = RaggedVerifyLayout.from_verify_lens(
            verify_lens_cpu=self.verify_lens, device=torch.device(device), grid=[layout.num_tokens])

    def filter_batch(self, new_indices, new_indices_cpu=None):  # a verify input never outlives its step
        raise RuntimeError("K3VerifyInput is per step; the draft state between steps is the scheduler's spec_info")

    def merge_batch(self, other):
        raise RuntimeError("K3VerifyInput is per step; the draft state between steps is the scheduler's spec_info")
