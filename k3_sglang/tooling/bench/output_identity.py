"""Output identity across bench arms, explained: is a greedy mismatch a numeric near tie or a bug?

The benches (`k3 bench verify`, `k3 bench plain-decode`) compare every arm's greedy output ids with arm A's (no
speculation) on the same prompt. In float32 token identity is the check: any mismatch fails. In bf16 the model's
arithmetic depends on the batch's shape (a different batch, a verify forward instead of a decode forward, a different
reduction order), so two lossless arms may pick different tokens where the top two are closer than bf16 can tell
apart; everything after that first differing token differs too. So for each mismatching request the bench asks at the
*first* differing position, with the common prefix as context (prompt + the output ids both arms agree on), for the
full log-probability row of that position from arm A's server (`return_logprob`, `top_logprobs_num` = vocabulary,
one prefill request) and classifies it (`classify`):

- a near tie: the two arms' tokens are the row's top two and their gap is at most the bf16 rounding of that row's
  logits, |logit| x 2^-8 (bf16 keeps 8 significant bits), with |logit| the larger of the two tokens' logits measured
  from the row's mean (log-probabilities fix logits only up to a shift; centering on the row's mean is the shift a
  model's logits sit around);
- not a near tie: anything else (a token outside the top two, or a gap above the rounding). The bench fails
  (exit 1) on any such mismatch, after writing its report.

Rows of the report read `arm key @position: A's token vs arm's token, gap G (tolerance T)`.
"""
from __future__ import annotations

import concurrent.futures
import math
from dataclasses import dataclass
from typing import Sequence

ROUNDING = {"bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}  # unit roundoff: half a unit in the last place, relative
TIE_DTYPES = ("bfloat16",)  # float32: token identity is the check, no mismatch is excused


@dataclass(frozen=True)
class Verdict:
    """One mismatch's first differing token, classified."""

    near_tie: bool
    gap: float | None  # |logprob(A's token) - logprob(the arm's token)| in the probe row; None without a row
    tolerance: float | None  # |logit| x rounding of the row's dtype; None where no tie is excused (float32)
    why: str  # one short reason, for the report
    rank: int | None = None  # the arm's token's rank in the probe row (1 = A's argmax there); None without a row


@dataclass(frozen=True)
class Mismatch:
    """One (prompt, arm) whose greedy output differs from A's."""

    key: str
    arm: str
    position: int  # index into the output ids of the first differing token
    ref_token: int | None  # A's token there (None: A's output ended first)
    other_token: int | None
    verdict: Verdict


def first_difference(ref: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first position where the two outputs differ (a length difference counts), None if equal."""
    for i, (a, b) in enumerate(zip(ref, other)):
        if a != b:
            return i
    return None if len(ref) == len(other) else min(len(ref), len(other))


def classify(ref_token: int | None, other_token: int | None, row: Sequence[float] | None, dtype: str) -> Verdict:
    """The verdict on a first differing token (module docstring). `row`: the probe's log-probabilities at that
    position, indexed by token id, the whole vocabulary ([V] floats); None when there was nothing to probe."""
    if ref_token is None or other_token is None:
        return Verdict(False, None, None, "outputs of different lengths")
    if dtype not in TIE_DTYPES:
        return Verdict(False, None, None, f"{dtype}: token identity is the check")
    if row is None or len(row) == 0:
        return Verdict(False, None, None, "no probe row")
    values = [float(x) for x in row]
    if any(math.isnan(x) for x in values):
        return Verdict(False, None, None, "NaN in the probe row")
    if max(ref_token, other_token) >= len(values) or min(ref_token, other_token) < 0:
        return Verdict(False, None, None, "token outside the probe row")
    ranks = sorted(range(len(values)), key=lambda t: values[t], reverse=True)
    gap = abs(values[ref_token] - values[other_token])
    rank = ranks.index(other_token) + 1
    if set(ranks[:2]) != {ref_token, other_token}:
        return Verdict(False, gap, None, f"not the top two (ranks {ranks.index(ref_token) + 1} and {rank})", rank)
    finite = [x for x in values if math.isfinite(x)]
    mean = sum(finite) / len(finite)
    magnitude = max(abs(values[ref_token] - mean), abs(values[other_token] - mean))
    tolerance = magnitude * ROUNDING[dtype]
    if gap <= tolerance:
        return Verdict(True, gap, tolerance, "near tie", rank)
    return Verdict(False, gap, tolerance, "gap above the row's rounding", rank)


def probe_response(url: str, context: list[int], vocab: int, http=None) -> tuple[list[float], dict]:
    """(row, meta_info) of one greedy prefill request after `context` with return_logprob and top_logprobs_num =
    vocab: the row is [vocab] log-probabilities by token id (-inf where unreported, NaN where null)."""
    import httpx

    body = {"input_ids": context, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": vocab}
    post = http.post if http is not None else (lambda u, json: httpx.post(u, json=json, timeout=1200))
    resp = post(url + "/generate", json=body)
    if resp.status_code != 200:
        raise RuntimeError(f"probe /generate answered {resp.status_code}: {resp.text[:300]}")
    meta = resp.json()["meta_info"]
    row = [float("-inf")] * vocab
    for lp, tok, *_ in meta["output_top_logprobs"][0]:
        if 0 <= tok < vocab:
            row[tok] = float("nan") if lp is None else float(lp)
    return row, meta


def probe_row(url: str, context: list[int], vocab: int, http=None) -> list[float]:
    """A's log-probability row for the token after `context` ([vocab] floats by token id; -inf where unreported)."""
    return probe_response(url, context, vocab, http)[0]


def server_vocab(url: str) -> int:
    """The vocabulary size of the model the server at url serves (its checkpoint's config.json)."""
    import json
    from pathlib import Path

    import httpx

    path = Path(httpx.get(url + "/model_info", timeout=60).json()["model_path"]) / "config.json"
    config = json.loads(path.read_text())
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not vocab:
        raise RuntimeError(f"no vocab_size in {path}")
    return int(vocab)


def find_mismatches(outputs: dict[str, dict[str, Sequence[int]]], ref: str = "A") -> list[tuple[str, str, int]]:
    """(key, arm, first differing position) for every entry whose output differs from `ref`'s on the same key."""
    out = []
    for key, by_arm in sorted(outputs.items()):
        if ref not in by_arm:
            continue
        for arm, ids in sorted(by_arm.items()):
            if arm != ref:
                pos = first_difference(by_arm[ref], ids)
                if pos is not None:
                    out.append((key, arm, pos))
    return out


def explain(outputs: dict[str, dict[str, Sequence[int]]], prompts: dict[str, list[int]], url: str | None,
            dtype: str, vocab: int, parallel: int = 4) -> list[Mismatch]:
    """Classify every mismatch against A (outputs[key][arm] -> ids; prompts[key] -> prompt ids), probing A's server
    at `url` in bf16 (float32 needs no probe: every mismatch fails)."""
    found = find_mismatches(outputs)

    def one(item):
        key, arm, pos = item
        ref_ids, ids = outputs[key]["A"], outputs[key][arm]
        ref_tok = ref_ids[pos] if pos < len(ref_ids) else None
        tok = ids[pos] if pos < len(ids) else None
        row = None
        if dtype in TIE_DTYPES and url is not None and ref_tok is not None and tok is not None:
            row = probe_row(url, list(prompts[key]) + list(ref_ids[:pos]), vocab)
        return Mismatch(key, arm, pos, ref_tok, tok, classify(ref_tok, tok, row, dtype))

    if not found:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(parallel, len(found))) as pool:
        return list(pool.map(one, found))


def failed(mismatches: list[Mismatch]) -> list[Mismatch]:
    """The mismatches that fail the bench: every one that is not a near tie."""
    return [m for m in mismatches if not m.verdict.near_tie]


def _row(m: Mismatch) -> str:
    v = m.verdict
    gap = "" if v.gap is None else f", gap {v.gap:.4g}" + ("" if v.tolerance is None else f" (tolerance {v.tolerance:.4g})")
    return f"{m.arm} {m.key} @{m.position}: {m.ref_token} vs {m.other_token}{gap}, {v.why}"


def summary_lines(mismatches: list[Mismatch], dtype: str, limit: int = 8, verdict: bool = True) -> list[str]:
    """Report lines: how many mismatches were near ties, and every one that was not (up to `limit`, then a count);
    `verdict` False leaves the pass/fail mark to another rule (the bf16 control, identity_control.py)."""
    if not mismatches:
        return []
    bad = failed(mismatches)
    ties = len(mismatches) - len(bad)
    if dtype in TIE_DTYPES:
        head = (f"first differing tokens: {ties} / {len(mismatches)} near ties (top-2 gap <= |logit| x 2^-8 in A's "
                f"row), {len(bad)} not")
    else:
        head = f"{dtype}: {len(mismatches)} (prompt, arm) outputs differ from A's, and in {dtype} every one fails"
    lines = [f"- {head}" + (": **FAIL**" if bad and verdict else "")]
    lines += [f"  - {_row(m)}" for m in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"  - ... and {len(bad) - limit} more")
    if not bad and ties:
        worst = max(mismatches, key=lambda m: m.verdict.gap / m.verdict.tolerance if m.verdict.tolerance else 0.0)
        lines.append(f"  - closest to the bar: {_row(worst)}")
    return lines
