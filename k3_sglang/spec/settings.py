"""Typed `K3_SPEC_*` settings of the K3_CSV speculative algorithm (a custom algorithm gets no ServerArgs fields).

The `spec` section of the worker processes' settings (`WorkerSettings.spec`, worker_settings.py), parsed once per
process from the environment `k3 serve` hands SGLang's workers:
- K3_SPEC_DRAFTER: `lookup` (default; prompt lookup over the request's own context, confidence calibrated online),
  `controlled` (replays a reference continuation with a known per-request acceptance; tests and benchmarks) or
  `checkpoint` (a DSpark-style draft model with a confidence head, read from K3_SPEC_DRAFT_PATH).
- K3_SPEC_DRAFT_PATH: the checkpoint drafter's directory (config.json + *.safetensors, spec/drafters/draft_checkpoint.py).
- K3_SPEC_VERIFY_MODE: `compact` (default; the planner picks each step's verify lengths and falls back to plain
  decoding when the cost model says speculation does not pay), `static` (verify every drafted token: the
  verify-all baseline) or `decode` (never verify: the no-spec arm through the same worker, for profiling).
- K3_SPEC_COST_TABLE: a step-cost JSON (`k3 bench profile-verify` writes it; SGLang's DSpark SPS tables are read
  too); unset = the built-in CPU affine default.
- K3_SPEC_ORACLE / K3_SPEC_PROFILE / K3_SPEC_SEED: the controlled drafter's reference JSONL, acceptance profile
  (chat, math, mix, perfect, zero or a number) and seed.
- K3_SPEC_LOOKUP_WINDOW: the lookup drafter's per-request index window in tokens (default 65536, about 60 MB per
  request at most; 0 = the whole context, unbounded).
- K3_SPEC_PRIOR: a saved calibrator posterior (JSON, `BetaBucketCalibrator.save`) the lookup drafter starts from;
  unset = a fresh calibrator (confidence 0.5, pooled per draft position as it learns).
- K3_SPEC_RECORD: append one JSON line per decode step (mode, batch, verify lengths, accepted, seconds) here.
- K3_SPEC_FORCE_VERIFY_LEN: profiling only: verify exactly this many tokens per request every step (drafts padded
  by repeating the root), whatever the drafter proposes.
- K3_SPEC_PLAIN_PATH: 1 (default) = a step the policy runs as plain decode takes SGLang's non-speculative path
  (spec/plain_path.py, where served); 0 = every step stays on SGLang's speculative path (the previous behaviour, for
  comparison).
Value checks (choices, integers, bounds) happen at parse; `ready()` adds what only a K3_CSV server needs (the
controlled drafter's oracle, the checkpoint drafter's directory, the files named exist, the prior parses); the draft
checkpoint itself is checked against the target by `spec/contract.py`'s `draft_refusals`.
"""
from __future__ import annotations

import os
from typing import ClassVar, Literal

from pydantic import Field

from k3_sglang.env_settings import EnvModel

ALGORITHM = "K3_CSV"
Drafter = Literal["lookup", "controlled", "checkpoint"]
VerifyMode = Literal["compact", "static", "decode"]
DEFAULT_LOOKUP_WINDOW = 65536  # tokens; about 60 MB of index per request at most (spec/drafters/lookup.py)


class SpecSettings(EnvModel):
    ENV_PREFIX: ClassVar[str] = "K3_SPEC_"

    drafter: Drafter = "lookup"
    verify_mode: VerifyMode = "compact"
    cost_table: str | None = None
    oracle: str | None = None
    profile: str = "mix"
    seed: int = Field(0, ge=0)
    record: str | None = None
    lookup_window: int = Field(DEFAULT_LOOKUP_WINDOW, ge=0)
    force_verify_len: int | None = Field(None, ge=1)
    prior: str | None = None
    draft_path: str | None = None
    plain_path: bool = True

    def ready(self) -> "SpecSettings":
        """Self, once the files K3_CSV will open are there (ValueError naming the setting otherwise)."""
        if self.drafter == "controlled" and not self.oracle:
            raise ValueError("K3_SPEC_DRAFTER=controlled needs K3_SPEC_ORACLE (a JSONL of input_ids/output_ids)")
        if self.drafter == "checkpoint" and not self.draft_path:
            raise ValueError("K3_SPEC_DRAFTER=checkpoint needs K3_SPEC_DRAFT_PATH (a draft checkpoint directory)")
        if self.draft_path and not os.path.isdir(self.draft_path):
            raise ValueError(f"K3_SPEC_DRAFT_PATH: no such directory {self.draft_path}")
        for name, path in (("K3_SPEC_COST_TABLE", self.cost_table), ("K3_SPEC_ORACLE", self.oracle),
                           ("K3_SPEC_PRIOR", self.prior)):
            if path and not os.path.isfile(path):
                raise ValueError(f"{name}: no such file {path}")
        if self.prior:
            from k3_sglang.spec.drafters.calibrate import BetaBucketCalibrator

            try:
                BetaBucketCalibrator.load(self.prior)
            except ValueError as exc:
                raise ValueError(f"K3_SPEC_PRIOR: {exc}") from None
        return self


def spec_settings() -> SpecSettings:
    """This worker process's K3_CSV settings (its WorkerSettings' `spec` section), checked ready."""
    from k3_sglang.worker_settings import worker_settings

    return worker_settings().spec.ready()
