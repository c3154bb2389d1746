"""Greedy answers of a resumed (cached) history against a recomputed one: a float32 near tie, or a bug?

A turn that resumes its history from a cache tier (device, host or storage) computes only its new tokens; the same
turn with the cache off recomputes the whole history, in other chunk boundaries (the KDA recurrence restarts from a
checkpoint instead of running through; attention sums its keys in other blocks). Both are float32 arithmetic in a
different order, so their logits differ in the last bits, and where a row's top two tokens are that close, greedy
decoding can pick either. Everything after that first differing token differs too (the histories diverge), so only
each session's first differing answer can be judged; the session's later turns are not comparable.

The judgement measures the numeric effect instead of assuming a bound. At the first differing position, with the
common context (the turn's prompt + the answer tokens both arms agree on), one server is probed twice
(`probe`: one greedy prefill with the whole log-probability row):

- `recomputed`: right after `/flush_cache`, so nothing is cached (the probe reports 0 cached tokens);
- `cached`: right after, so the context's history comes from the cache (the probe reports cached tokens > 0).

`delta` = the largest |recomputed - cached| over the row: what caching alone moves a log-probability here.
`classify` calls the flip a near tie when (a) delta <= MAX_DELTA (the rows agree to rounding: a wrong cached state,
page or checkpoint moves log-probabilities by far more), (b) the two arms' tokens are the recomputed row's top two,
and (c) their gap there is at most 2 x delta (each row may sit delta away from the other arm's). Anything else, a
probe that found nothing cached or nothing recomputed included, is not a near tie.

A flip that is not a near tie can still be the recompute's doing: K3's MoE routing picks the top experts by score,
and where two scores sit within rounding (a routing near tie) float32 in one chunking picks one expert and in
another chunking the other, moving that token's hidden state by far more than rounding. So a flip the probes do not
excuse is judged by an exact model (`reference_verdict`, the float64 reference of tests/utils/reference_k3.py):
excused when the cached arm's token is the reference's argmax. Measured on 2026-12-08 (the HiCache default-sessions
test): the cached arm's row agreed with float64 to 5e-5, the recompute's differed by 0.42, and the reference shows a
routing margin of 1.7e-6 four tokens before the answer, inside the part the two arms chunk differently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

MAX_DELTA = 1e-3  # log-probability: rounding moves float32 rows by ~1e-6..1e-4; a wrong state moves them by ~0.1+


@dataclass(frozen=True)
class Probe:
    """One probe of the row after a context: [vocab] log-probabilities by token id, and the tokens it found cached."""

    row: tuple[float, ...]
    cached_tokens: int


@dataclass(frozen=True)
class CacheFlip:
    """One session's first differing answer token, judged."""

    excused: bool
    why: str
    gap: float | None = None  # |logprob(ref) - logprob(other)| in the recomputed row
    delta: float | None = None  # max |recomputed - cached| over the row


def classify(ref_token: int, other_token: int, recomputed: Probe, cached: Probe,
             max_delta: float = MAX_DELTA) -> CacheFlip:
    """The verdict on a first differing token (module docstring); `ref_token` is the cache-off arm's."""
    if recomputed.cached_tokens != 0:
        return CacheFlip(False, f"the recomputed probe found {recomputed.cached_tokens} tokens cached")
    if cached.cached_tokens <= 0:
        return CacheFlip(False, "the cached probe found nothing cached")
    a, b = recomputed.row, cached.row
    if len(a) != len(b) or not a:
        return CacheFlip(False, "probe rows of different lengths")
    if any(math.isnan(x) for x in (*a, *b)):
        return CacheFlip(False, "NaN in a probe row")
    if not (0 <= min(ref_token, other_token) and max(ref_token, other_token) < len(a)):
        return CacheFlip(False, "token outside the probe row")
    both = [i for i in range(len(a)) if math.isfinite(a[i]) and math.isfinite(b[i])]
    if ref_token not in both or other_token not in both:
        return CacheFlip(False, "a token missing from a probe row")
    delta = max(abs(a[i] - b[i]) for i in both)
    gap = abs(a[ref_token] - a[other_token])
    if delta > max_delta:
        return CacheFlip(False, f"caching moves the row by {delta:.3g} (> {max_delta:g}): more than rounding", gap,
                         delta)
    top = sorted(range(len(a)), key=lambda t: a[t], reverse=True)[:2]
    if set(top) != {ref_token, other_token}:
        return CacheFlip(False, "the two tokens are not the recomputed row's top two", gap, delta)
    if gap > 2 * delta:
        return CacheFlip(False, f"gap {gap:.3g} above 2 x delta {delta:.3g}", gap, delta)
    return CacheFlip(True, f"near tie: gap {gap:.3g} <= 2 x delta {delta:.3g}", gap, delta)


def reference_verdict(reference_row: Sequence[float], ref_token: int, other_token: int) -> CacheFlip:
    """A flip the probes did not excuse, judged by an exact model: `reference_row` is a float64 reference's
    log-probability row at the first differing position ([vocab]). Excused when the cached arm's token
    (`other_token`) is the reference's argmax and the recompute's (`ref_token`) is not: then the recompute is the arm
    that strayed (e.g. an MoE routing near tie that float32 rounding flipped in its chunk boundaries)."""
    row = [float(x) for x in reference_row]
    if any(math.isnan(x) for x in row) or not (0 <= min(ref_token, other_token)
                                                and max(ref_token, other_token) < len(row)):
        return CacheFlip(False, "no usable reference row")
    best = max(range(len(row)), key=lambda t: row[t])
    gap = abs(row[ref_token] - row[other_token])
    if best == other_token:
        return CacheFlip(True, f"the cached arm's token is the float64 reference's argmax (the recompute's is "
                               f"{gap:.3g} below it): the recompute strayed", gap)
    return CacheFlip(False, f"the float64 reference's argmax is {best}, not the cached arm's {other_token}", gap)


def probe(url: str, context: list[int], vocab: int) -> Probe:
    """The server's log-probability row for the token after `context` and the tokens it found cached (one greedy
    prefill request, output_identity.probe_response)."""
    from k3_sglang.tooling.bench.output_identity import probe_response

    row, meta = probe_response(url, context, vocab)
    return Probe(tuple(row), int(meta.get("cached_tokens", 0)))


def flush(url: str) -> None:
    """Empty the server's radix cache (every tier the tree holds); the server must be idle."""
    import httpx

    resp = httpx.post(url + "/flush_cache", timeout=120)
    if resp.status_code != 200:
        raise RuntimeError(f"/flush_cache answered {resp.status_code}: {resp.text[:300]}")


def judge(url: str, vocab: int, context: list[int], ref_token: int, other_token: int) -> CacheFlip:
    """Probe the server at `url` recomputed then cached at `context` and classify the flip ref_token -> other_token."""
    flush(url)
    recomputed = probe(url, context, vocab)
    cached = probe(url, context, vocab)
    return classify(ref_token, other_token, recomputed, cached)


def first_flips(ref: Sequence, other: Sequence) -> list[tuple[int, int]]:
    """Each session's first differing answer between two arms' records of the same traffic, in sending order
    (bench/session_traffic.TurnRecord): (record index, position in the answer). A session's later turns are skipped
    (their prompts hold the differing answer)."""
    flipped, out = set(), []
    for i, (r, o) in enumerate(zip(ref, other, strict=True)):
        if (r.session, r.turn) != (o.session, o.turn):
            raise ValueError(f"record {i}: not the same traffic")
        if r.session in flipped or tuple(r.output_ids) == tuple(o.output_ids):
            continue
        flipped.add(r.session)
        pos = next((k for k, (x, y) in enumerate(zip(r.output_ids, o.output_ids)) if x != y),
                   min(len(r.output_ids), len(o.output_ids)))
        out.append((i, pos))
    return out
