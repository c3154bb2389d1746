"""Typed `K3_SPEC_*` settings of the K3_CSV speculative algorithm (a custom algorithm gets no ServerArgs fields).

Parsed once per process from the environment `k3 serve` hands SGLang's workers:
- K3_SPEC_DRAFTER: `lookup` (default; prompt lookup over the request's own context, confidence calibrated online)
  or `controlled` (replays a reference continuation with a known per-request acceptance; tests and benchmarks).
- K3_SPEC_VERIFY_MODE: `compact` (default; the planner picks each step's verify lengths and falls back to plain
  decoding when the cost model says speculation does not pay), `static` (verify every drafted token: the
  verify-all baseline) or `decode` (never verify: the no-spec arm through the same worker, for profiling).
- K3_SPEC_COST_TABLE: a step-cost JSON (`k3 bench profile-verify` writes it; SGLang's DSpark SPS tables are read
  too); unset = the built-in CPU affine default.
- K3_SPEC_ORACLE / K3_SPEC_PROFILE / K3_SPEC_SEED: the controlled drafter's reference JSONL, acceptance profile
  (chat, math, mix, perfect, zero or a number) and seed.
- K3_SPEC_LOOKUP_WINDOW: the lookup drafter's per-request index window in tokens (default 65536, about 60 MB per
  request at most; 0 = the whole context, unbounded).
- K3_SPEC_RECORD: append one JSON line per decode step (mode, batch, verify lengths, accepted, seconds) here.
- K3_SPEC_FORCE_VERIFY_LEN: profiling only: verify exactly this many tokens per request every step (drafts padded
  by repeating the root), whatever the drafter proposes.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from k3_sglang.serving.settings import _choice_env, _int_env
from k3_sglang.spec.drafters.lookup import DEFAULT_WINDOW

ALGORITHM = "K3_CSV"
DRAFTERS = ("lookup", "controlled")
VERIFY_MODES = ("compact", "static", "decode")


def _optional_int(name: str, minimum: int) -> int | None:
    """An integer setting that may be unset (None)."""
    return _int_env(name, 0, minimum) if os.environ.get(name, "").strip() else None


@dataclass(frozen=True)
class SpecSettings:
    drafter: str = "lookup"
    verify_mode: str = "compact"
    cost_table: str | None = None
    oracle: str | None = None
    profile: str = "mix"
    seed: int = 0
    record: str | None = None
    lookup_window: int = DEFAULT_WINDOW
    force_verify_len: int | None = None

    @classmethod
    def from_env(cls) -> "SpecSettings":
        settings = cls(
            drafter=_choice_env("K3_SPEC_DRAFTER", "lookup", DRAFTERS),
            verify_mode=_choice_env("K3_SPEC_VERIFY_MODE", "compact", VERIFY_MODES),
            cost_table=os.environ.get("K3_SPEC_COST_TABLE") or None,
            oracle=os.environ.get("K3_SPEC_ORACLE") or None,
            profile=os.environ.get("K3_SPEC_PROFILE", "").strip() or "mix",
            seed=_int_env("K3_SPEC_SEED", 0, 0),
            record=os.environ.get("K3_SPEC_RECORD") or None,
            lookup_window=_int_env("K3_SPEC_LOOKUP_WINDOW", DEFAULT_WINDOW, 0),
            force_verify_len=_optional_int("K3_SPEC_FORCE_VERIFY_LEN", 1),
        )
        if settings.drafter == "controlled" and not settings.oracle:
            raise ValueError("K3_SPEC_DRAFTER=controlled needs K3_SPEC_ORACLE (a JSONL of input_ids/output_ids)")
        for name, path in (("K3_SPEC_COST_TABLE", settings.cost_table), ("K3_SPEC_ORACLE", settings.oracle)):
            if path and not os.path.isfile(path):
                raise ValueError(f"{name}: no such file {path}")
        return settings


@functools.lru_cache(maxsize=1)
def spec_settings() -> SpecSettings:
    return SpecSettings.from_env()
