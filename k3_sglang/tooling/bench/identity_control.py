"""The bf16 control of the benches' output identity: how much does the no-spec server's own output move with batch
shape, and do the speculative arms move more?

On the tiny random-weight K3 in bf16, a no-spec server's greedy output for a prompt changes with the batch it runs
in (docs/spec.md, "Output identity in the benches"), at first differing tokens far from near ties. So the near-tie
rule of output_identity.py alone fails every bf16 run on batch-shape noise. The control measures that noise on the
same server, prompts and step count as the timed rounds, and the spec arms are judged against it:

- Control arm `A~`: A's server again, after the timed rounds, on a sample of the rounds' prompts (CONTROL_KEYS per
  concurrency) at another batch shape: each prompt alone when the round ran c > 1 requests together, in pairs of
  two prompts at c = 1. Its mismatches against A are classified by output_identity.explain like any arm's (first
  differing token, gap and rank in A's probe row).
- Envelope (`Envelope`): the share of control prompts that flipped (`flipped / compared`), and the largest gap and
  worst rank of a control flip's first differing token.
- Judgement (`judge`), bf16 only: a spec arm's mismatch passes when it is a near tie, or when its first differing
  token lies inside the envelope (gap <= the control's largest, rank <= the control's worst). An arm fails when any
  mismatch lies outside, or when its share of flipped prompts exceeds the control's share by more than three
  binomial standard errors of the control sample (`allowed_flips`, with the control's share taken as at least one
  flip). float32 is not judged here: every mismatch fails (output_identity.failed).
A control that never flipped excuses nothing beyond near ties (its envelope is empty).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from k3_sglang.tooling.bench.output_identity import Mismatch

CONTROL_ARM = "A~"
CONTROL_KEYS = 16  # prompts per concurrency the control reruns
RATE_SIGMAS = 3.0


@dataclass(frozen=True)
class Envelope:
    """What batch shape alone did to the no-spec server's output on the control sample."""

    compared: int
    flipped: int
    max_gap: float | None  # None: no control flip had a probe row (or none flipped)
    max_rank: int | None

    @classmethod
    def of(cls, control: list[Mismatch], compared: int) -> "Envelope":
        rows = [m.verdict for m in control if m.verdict.gap is not None and m.verdict.rank is not None]
        return cls(compared, len({m.key for m in control}), max((v.gap for v in rows), default=None),
                   max((v.rank for v in rows), default=None))

    def holds(self, m: Mismatch) -> bool:
        """The mismatch's first differing token is no further from A's than a control flip's was."""
        v = m.verdict
        if v.near_tie:
            return True
        if self.max_gap is None or v.gap is None or v.rank is None or math.isnan(v.gap):
            return False
        return v.gap <= self.max_gap and v.rank <= self.max_rank

    def allowed_flips(self, n: int) -> int:
        """The most of n prompts an arm may see flipped: n x (p + RATE_SIGMAS x sqrt(p (1 - p) / compared)), p the
        control's share with at least one flip counted."""
        if self.compared <= 0:
            return 0
        p = max(self.flipped, 1) / self.compared
        return min(n, math.floor(n * (p + RATE_SIGMAS * math.sqrt(p * (1 - p) / self.compared))))


@dataclass(frozen=True)
class Judgement:
    """One (section, arm) judged against the control."""

    arm: str
    compared: int
    flipped: int
    allowed: int
    outside: tuple[Mismatch, ...]  # mismatches beyond the envelope

    @property
    def ok(self) -> bool:
        return not self.outside and self.flipped <= self.allowed


def control_groups(keys: list[str], c: int, limit: int = CONTROL_KEYS) -> list[list[str]]:
    """The control's requests, in groups sent together: the first `limit` keys, alone when the rounds ran c > 1
    requests at once, in consecutive pairs at c = 1 (a last odd key goes with the first key, whose second output is
    not compared)."""
    keys = keys[:limit]
    if c > 1:
        return [[k] for k in keys]
    return [keys[i: i + 2] if i + 1 < len(keys) else [keys[i], keys[0]] for i in range(0, len(keys), 2)]


def run_control(url: str, groups: list[list[str]], prompts: dict[str, list[int]], new_tokens: int) -> dict:
    """{key: output ids} of each group's prompts sent together to the server at url (greedy, ignore_eos); a key that
    appears twice keeps its first group's output."""
    from k3_sglang.tooling.bench.verify import _post_all

    out: dict[str, tuple[int, ...]] = {}
    for group in groups:
        ids = _post_all(url, [prompts[k] for k in group], new_tokens, parallel=len(group))
        for k, o in zip(group, ids):
            out.setdefault(k, tuple(o))
    return out


def judge(mismatches: list[Mismatch], compared: dict[str, int], control_compared: int) -> list[Judgement]:
    """Each arm's mismatches of one section (one concurrency) against the section's control; `compared[arm]` is how
    many prompts the arm was compared on, `control_compared` how many the control was."""
    env = Envelope.of([m for m in mismatches if m.arm == CONTROL_ARM], control_compared)
    out = []
    for arm, n in sorted(compared.items()):
        if arm in ("A", CONTROL_ARM):
            continue
        mine = [m for m in mismatches if m.arm == arm]
        out.append(Judgement(arm, n, len({m.key for m in mine}), env.allowed_flips(n),
                             tuple(m for m in mine if not env.holds(m))))
    return out


def envelope_line(mismatches: list[Mismatch], control_compared: int) -> str:
    env = Envelope.of([m for m in mismatches if m.arm == CONTROL_ARM], control_compared)
    gap = "no flip" if env.max_gap is None else f"largest first-token gap {env.max_gap:.3g}, worst rank {env.max_rank}"
    return (f"control {CONTROL_ARM} (A's server, same prompts at another batch shape): {env.flipped} / "
            f"{env.compared} prompts flipped; {gap}")


def judgement_lines(judgements: list[Judgement], limit: int = 4) -> list[str]:
    lines = []
    for j in judgements:
        verdict = "within the control" if j.ok else "**FAIL**"
        lines.append(f"{j.arm}: {j.flipped} / {j.compared} prompts flipped (the control allows {j.allowed}), "
                     f"{len(j.outside)} first differing tokens outside its envelope: {verdict}")
        for m in j.outside[:limit]:
            v = m.verdict
            gap = "" if v.gap is None else f", gap {v.gap:.3g}, rank {v.rank}"
            lines.append(f"  - {m.key} @{m.position}: {m.ref_token} vs {m.other_token}{gap}, {v.why}")
    return lines
