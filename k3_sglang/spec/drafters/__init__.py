"""Drafters of K3_CSV.

- `lookup`: prompt lookup over the request's own context, confidence calibrated online (lookup.py, calibrate.py).
- `controlled`: replays a reference continuation with a known acceptance q (controlled.py; tests and benchmarks).
- `checkpoint`: a DSpark-style draft model with a confidence head (checkpoint.py over draft_checkpoint.py, torch),
  fed the target's hidden states at every root by the worker (spec/root_capture.py).
The first two are pure python + numpy; torch is imported only for `checkpoint`.
"""
from __future__ import annotations

import os

from k3_sglang.spec.drafters.base import DraftBlock, Drafter, DraftRequest
from k3_sglang.spec.drafters.calibrate import BetaBucketCalibrator, CalibratorConfig
from k3_sglang.spec.drafters.controlled import ControlledConfig, ControlledDrafter, load_oracle
from k3_sglang.spec.drafters.lookup import DEFAULT_WINDOW, LookupConfig, LookupDrafter

DRAFTER_KINDS = ("lookup", "controlled", "checkpoint")

__all__ = ["DraftBlock", "DraftRequest", "Drafter", "LookupDrafter", "ControlledDrafter", "BetaBucketCalibrator",
           "build_drafter", "DRAFTER_KINDS"]


def build_drafter(
    kind: str,
    *,
    oracle_path: str | None = None,
    profile: str = "mix",
    seed: int = 0,
    vocab_size: int | None = None,
    prior_path: str | None = None,
    lookup_window: int = DEFAULT_WINDOW,
    draft_path: str | None = None,
    target=None,
) -> Drafter:
    """A drafter by kind: "lookup" (prior_path: optional saved calibrator JSON), "controlled" (oracle_path and
    vocab_size required) or "checkpoint" (draft_path, a DSpark-style draft checkpoint directory, and target, the
    serving model's `TargetHeads`). Bad kind or inputs -> ValueError with a clear message."""
    if kind == "lookup":
        calibrator = BetaBucketCalibrator.load(prior_path) if prior_path else BetaBucketCalibrator(CalibratorConfig())
        return LookupDrafter(LookupConfig(window=lookup_window), calibrator)
    if kind == "controlled":
        if not oracle_path:
            raise ValueError("controlled drafter needs an oracle file (K3_SPEC_ORACLE)")
        if not os.path.isfile(oracle_path):
            raise ValueError(f"controlled drafter: oracle file not found: {oracle_path}")
        if vocab_size is None:
            raise ValueError("controlled drafter needs vocab_size (corrupted drafts wrap modulo the vocabulary)")
        return ControlledDrafter.from_file(oracle_path, ControlledConfig(profile=profile, seed=seed, vocab_size=int(vocab_size)))
    if kind == "checkpoint":
        if not draft_path:
            raise ValueError("checkpoint drafter needs a draft checkpoint directory (K3_SPEC_DRAFT_PATH)")
        if target is None:
            raise ValueError("checkpoint drafter needs the target model's embedding and lm_head (a K3_CSV worker)")
        from k3_sglang.spec.drafters.checkpoint import CheckpointDrafter

        return CheckpointDrafter.load(draft_path, target)
    raise ValueError(f"unknown drafter kind {kind!r}; expected one of {', '.join(DRAFTER_KINDS)}")
