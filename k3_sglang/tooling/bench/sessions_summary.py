"""Figures of `k3 bench sessions` from the per-turn records of each arm (pure: no server, no SGLang).

An arm is one server configuration serving the same round-robin agent traffic (bench/session_traffic.py). A
resumed turn is any turn after a session's first: the one HiCache is for. Per arm: TTFT p50/p99 of resumed turns,
prompt tokens prefilled per resumed turn, where the cached tokens came from (device, host, storage) as shares of
the resumed turns' prompt tokens, and whether every greedy answer equals the baseline arm's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k3_sglang.tooling.bench.session_traffic import TurnRecord

TIERS = ("device", "host", "storage")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class ArmSummary:
    """One arm's figures over its resumed turns (turn >= 1, or the turns after a restart) and its first turns."""

    arm: str
    resumed_turns: int
    ttft_p50_s: float
    ttft_p99_s: float
    first_turn_ttft_p50_s: float
    prefilled_per_turn: float  # prompt tokens computed per resumed turn (mean)
    prompt_per_turn: float  # prompt tokens per resumed turn (mean)
    tier_share: dict  # tier -> cached tokens from it / resumed prompt tokens
    mismatches: int  # answers that differ from the baseline arm's (0 for the baseline itself)

    @property
    def cached_share(self) -> float:
        """Share of resumed prompt tokens served from any cache tier."""
        return 1.0 - self.prefilled_per_turn / self.prompt_per_turn


def _tier_tokens(record: TurnRecord) -> dict[str, int]:
    """Cached tokens by tier; a report without details (HiCache off) counts all of them as device hits."""
    if record.cached_by_tier:
        return {t: int(record.cached_by_tier.get(t, 0)) for t in TIERS}
    return {"device": record.cached_tokens, "host": 0, "storage": 0}


def answers(records: list[TurnRecord]) -> dict[tuple[int, int], tuple[int, ...]]:
    """(session, turn) -> the greedy answer."""
    return {(r.session, r.turn): tuple(r.output_ids) for r in records}


def summarize(arm: str, records: list[TurnRecord], baseline: list[TurnRecord] | None = None,
              resumed_from: int = 1) -> ArmSummary:
    """The arm's figures; `baseline` (another arm's records of the same traffic) counts answer mismatches (over every
    turn). The resumed-turn figures count turns >= resumed_from (>= 1)."""
    if resumed_from < 1:
        raise ValueError(f"resumed_from must be >= 1, got {resumed_from}")
    resumed = [r for r in records if r.turn >= resumed_from]
    first = [r for r in records if r.turn == 0]
    if not resumed or not first:
        raise ValueError(f"arm {arm}: needs first and resumed turns (got {len(first)} and {len(resumed)})")
    prompt = sum(r.prompt_tokens for r in resumed)
    tiers = {t: 0 for t in TIERS}
    for r in resumed:
        for t, n in _tier_tokens(r).items():
            tiers[t] += n
    mismatches = 0
    if baseline is not None:
        want = answers(baseline)
        got = answers(records)
        if set(want) != set(got):
            raise ValueError(f"arm {arm}: not the baseline's traffic")
        mismatches = sum(got[k] != want[k] for k in got)
    return ArmSummary(arm=arm, resumed_turns=len(resumed),
                      ttft_p50_s=percentile([r.ttft_s for r in resumed], 50),
                      ttft_p99_s=percentile([r.ttft_s for r in resumed], 99),
                      first_turn_ttft_p50_s=percentile([r.ttft_s for r in first], 50),
                      prefilled_per_turn=sum(r.prefilled_tokens for r in resumed) / len(resumed),
                      prompt_per_turn=prompt / len(resumed),
                      tier_share={t: n / prompt for t, n in tiers.items()}, mismatches=mismatches)


def ratio(slow: ArmSummary | None, fast: ArmSummary | None) -> float | None:
    """slow.ttft_p50 / fast.ttft_p50 (how many times faster `fast` resumes a turn), None if an arm is missing."""
    if slow is None or fast is None or fast.ttft_p50_s <= 0:
        return None
    return slow.ttft_p50_s / fast.ttft_p50_s
