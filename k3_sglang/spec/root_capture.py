"""The target's hidden states at every request's root, for K3_CSV's draft-model drafter (spec/drafters/checkpoint.py).

It uses the seam SGLang's own draft-model workers (DSpark, DFlash) use: `set_dspark_layers_to_capture(layer_ids)`
on the target model (SGLang's K3 has it) makes every forward hand the LogitsProcessor
the streams after those layers, and the forward's `capture_hidden_mode` picks the rows SGLang returns in
`logits_output.hidden_states` [rows, C*H]:
- extend (prefill; the last chunk counts): LAST, one row per request, its last token, whose logits chose the first
  output token (the root of its first decode step);
- plain decode: LAST, one row per request, whose logits chose the new root;
- verify: FULL, every packed row; request b's new root (the bonus token) was chosen by its last accepted row,
  qo_indptr[b] + commit_len[b] - 1 (`verify_root_rows`).
Each row is stored with the request's context length once that root is committed (prompt + output + the tokens
this step commits), and the drafter uses it only when the request's context has exactly that length.
"""
from __future__ import annotations

import logging

import torch

from k3_sglang.spec.drafters.checkpoint import TargetHeads

logger = logging.getLogger(__name__)


def verify_root_rows(lens: list[int], commit_lens: list[int]) -> list[int]:
    """Packed verify row of each request's last accepted token: lens [B] verified chain lengths, commit_lens [B]
    (1 <= commit_len <= len) -> [B] row indices into the T = sum(lens) verify rows."""
    rows, start = [], 0
    for n, c in zip(lens, commit_lens):
        if not 1 <= c <= n:
            raise ValueError(f"verify_root_rows: commit length {c} outside 1..{n}")
        rows.append(start + c - 1)
        start += n
    return rows


def _lm_head(model) -> torch.nn.Module:
    for holder in (model, getattr(model, "language_model", None)):
        head = getattr(holder, "lm_head", None)
        if head is not None and hasattr(head, "weight"):
            return head
    raise ValueError("K3_SPEC_DRAFTER=checkpoint: the target model has no lm_head weight to share with the draft")


def target_heads(model, model_config) -> TargetHeads:
    """The target's embedding and lm_head weights [V(, padded), H] and shapes, for the draft to share."""
    num_layers = int(getattr(model_config, "num_hidden_layers", 0) or getattr(model, "end_layer", 0))
    return TargetHeads(embed_weight=model.get_input_embeddings().weight.detach(),
                       lm_head_weight=_lm_head(model).weight.detach(),
                       hidden_size=int(model_config.hidden_size), vocab_size=int(model_config.vocab_size),
                       num_layers=num_layers)


class RootCapture:
    """Turns on the target's capture at the drafter's layers and feeds each forward's root rows to the drafter.
    `drafter` is a callable returning the policy's current drafter (it is rebuilt after a cache flush)."""

    def __init__(self, model, drafter) -> None:
        self._drafter = drafter
        model.set_dspark_layers_to_capture(list(drafter().target_layer_ids))

    @staticmethod
    def mode(verify: bool):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        return CaptureHiddenMode.FULL if verify else CaptureHiddenMode.LAST

    def _put(self, reqs, rows: list[int] | None, committed: list[int], logits_output) -> None:
        hidden = getattr(logits_output, "hidden_states", None)
        drafter = self._drafter()
        expected = len(reqs) if rows is None else None
        if hidden is None or hidden.dim() != 2 or hidden.shape[1] != drafter.feature_width or (
                expected is not None and hidden.shape[0] != expected):
            shape = None if hidden is None else tuple(hidden.shape)
            logger.warning("K3_CSV: no root hidden states this step (got %s); those requests draft nothing", shape)
            return
        if rows is not None:
            hidden = hidden[torch.tensor(rows, dtype=torch.int64, device=hidden.device)]
        lens = [len(r.origin_input_ids) + len(r.output_ids) + c for r, c in zip(reqs, committed)]
        drafter.put_roots([r.rid for r in reqs], lens, hidden)

    def after_one_token(self, reqs, logits_output) -> None:
        """After an extend or a plain decode forward (one sampled token per request)."""
        self._put(reqs, None, [1] * len(reqs), logits_output)

    def after_verify(self, reqs, logits_output, lens: list[int], commit_lens: list[int]) -> None:
        """After a verify forward whose request b verified lens[b] tokens and commits commit_lens[b]."""
        self._put(reqs, verify_root_rows(lens, commit_lens), list(commit_lens), logits_output)
