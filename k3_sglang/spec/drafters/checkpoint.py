"""K3_CSV's draft-model drafter (`K3_SPEC_DRAFTER=checkpoint`): a DSpark-style draft checkpoint with a confidence head.

Each decode step it runs `DSparkStyleDraft` (draft_checkpoint.py) once over every request that has a fresh root
feature: the target's hidden states after the draft's `target_layer_ids` at the row whose logits chose the root
(spec/root_capture.py hands them over after every target forward). It proposes min(gamma, draft block) tokens per
request, with confidence = sigmoid(confidence head) per token, which the planner reads as any drafter's conditional
acceptance (survival = cumulative product). A request whose root has no fresh feature (its committed length moved
without a captured forward: a retraction, PD's first decode step) gets no drafts that step; the next forward
captures again.

Torch (the draft runs on the target's device); the confidence and tokens go to the planner as numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from k3_sglang.spec.drafters.base import DraftBlock, DraftRequest, check_gamma, check_observation
from k3_sglang.spec.drafters.draft_checkpoint import DSparkStyleDraft, load_draft_checkpoint, target_mismatches


@dataclass(frozen=True)
class TargetHeads:
    """What the draft borrows from the target: embed [V, H] and lm_head [V, H] weights (on the target's device),
    and the target's shapes it is checked against."""

    embed_weight: torch.Tensor
    lm_head_weight: torch.Tensor
    hidden_size: int
    vocab_size: int
    num_layers: int


@dataclass(frozen=True)
class RootFeature:
    """hidden [C*H] at the row that chose the root; context_len: prompt + output length once that root is committed
    (the key a later proposal must match)."""

    context_len: int
    hidden: torch.Tensor


class CheckpointDrafter:
    """Drafter protocol (base.py) over a DSpark-style draft; `put_roots` is fed by the worker's root capture."""

    def __init__(self, draft: DSparkStyleDraft) -> None:
        self.draft = draft
        self._roots: dict[str, RootFeature] = {}
        self._drafted: dict[str, int] = {}

    @classmethod
    def load(cls, path: str, target: TargetHeads) -> "CheckpointDrafter":
        """The checkpoint at `path` for this target (ValueError: bad checkpoint, or it does not fit the target)."""
        from k3_sglang.spec.drafters.draft_checkpoint import check_draft_files

        config = check_draft_files(path)
        problems = target_mismatches(config, target.hidden_size, target.vocab_size, target.num_layers)
        if problems:
            raise ValueError(f"K3_SPEC_DRAFT_PATH {path}: " + "; ".join(problems))
        # a head the target holds whole ([V or padded V, H]); a TP shard is no use: the checkpoint must bring its own
        embed, head = (w[: config.vocab_size] if w.shape[0] >= config.vocab_size and w.shape[-1] == config.hidden_size
                       else None for w in (target.embed_weight, target.lm_head_weight))
        draft = load_draft_checkpoint(path, embed_weight=embed, lm_head_weight=head, device=target.embed_weight.device)
        return cls(draft)

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.draft.config.target_layer_ids

    @property
    def feature_width(self) -> int:
        c = self.draft.config
        return c.num_context_features * c.hidden_size

    def put_roots(self, rids: Sequence[str], context_lens: Sequence[int], hidden: torch.Tensor) -> None:
        """hidden [B, C*H]: row b is the feature of request rids[b]'s root once its context is context_lens[b]."""
        if hidden.shape != (len(rids), self.feature_width):
            raise ValueError(f"put_roots: hidden {tuple(hidden.shape)} must be [{len(rids)}, {self.feature_width}]")
        for b, (rid, n) in enumerate(zip(rids, context_lens)):
            self._roots[rid] = RootFeature(int(n), hidden[b].detach())

    def propose(self, requests: Sequence[DraftRequest], gamma: int) -> DraftBlock:
        check_gamma(gamma)
        n = len(requests)
        g = min(int(gamma), self.draft.config.gamma)
        block = DraftBlock.empty(n, int(gamma))
        rows, feats, anchors = [], [], []
        for b, req in enumerate(requests):
            root = self._roots.get(req.rid)
            if req.output and root is not None and root.context_len == len(req.prompt) + len(req.output):
                rows.append(b)
                feats.append(root.hidden)
                anchors.append(int(req.output[-1]))
            self._drafted[req.rid] = 0
        if not rows:
            return block
        device = feats[0].device
        tokens, conf = self.draft(torch.stack(feats), torch.tensor(anchors, dtype=torch.int64, device=device))
        tokens = tokens[:, :g].cpu().numpy()
        conf = conf[:, :g].double().cpu().numpy()
        for i, b in enumerate(rows):
            block.tokens[b, :g] = tokens[i]
            block.conf[b, :g] = conf[i]
            block.n_drafted[b] = g
            self._drafted[requests[b].rid] = g
        return block

    def observe(self, rid: str, n_verified: int, n_accepted: int) -> None:
        """The confidence is the trained head's: nothing is learned online; the observation is only checked."""
        check_observation(n_verified, n_accepted, self._drafted.get(rid, 0))

    def release(self, rid: str) -> None:
        self._roots.pop(rid, None)
        self._drafted.pop(rid, None)

