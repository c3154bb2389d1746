"""Prompt-lookup (n-gram) drafter over each request's own prompt + committed output, confidence calibrated online.

Per request the context is prompt + output; its last token (output[-1]) is the root. The index maps, for every
n in 1..max_n, an n-gram to the end position of its most recent occurrence whose continuation token is known
(and to the previous such occurrence, for agreement). Each step only the newly committed tokens are indexed:
O(new tokens * max_n) dict work, never a rescan of the context. Memory is capped by `window`: only the last `window`
end positions stay indexed (about max_n dict entries each), older ones are evicted as the context grows.

Proposal: the longest n whose context suffix (ending at the root) occurred earlier; the drafts are the tokens that
followed its most recent earlier occurrence, chaining into the drafts themselves when the copy runs past the
context end (periodic text). Features of draft j: (min(j, max_pos), matched-n bucket, source, agreement):
  n bucket: 0 -> n=1, 1 -> n=2, 2 -> n in 3..4, 3 -> n >= 5
  source: 0 prompt, 1 output (committed output or the chained drafts)
  agreement: 0 only one earlier occurrence, 1 the previous occurrence continued differently, 2 it continued the same
Confidence is the calibrator's conditional acceptance of the bucket; observe() feeds verified outcomes back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from k3_sglang.spec.drafters.base import DraftBlock, DraftRequest, check_gamma, check_observation
from k3_sglang.spec.drafters.calibrate import BetaBucketCalibrator, CalibratorConfig
from k3_sglang.spec.settings import DEFAULT_LOOKUP_WINDOW


# 65,536 end positions x 6 n-gram sizes: about 60 MB per request at most, whatever the context length (about 155 bytes
# per entry with the token list, tests/spec/test_drafters_lookup.py; measured 56 MB for a 200K-token context, where
# the whole-context index would hold about 3x that).
DEFAULT_WINDOW = DEFAULT_LOOKUP_WINDOW  # K3_SPEC_LOOKUP_WINDOW's default


@dataclass(frozen=True)
class LookupConfig:
    """min_n..max_n: n-gram sizes; max_pos: positions >= max_pos share a bucket; window: end positions kept indexed
    per request (0: the whole context, unbounded memory)."""

    min_n: int = 1
    max_n: int = 6
    max_pos: int = 7
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"LookupConfig: need 1 <= min_n ({self.min_n}) <= max_n ({self.max_n})")
        if self.window < 0:
            raise ValueError(f"LookupConfig: window must be >= 0 (0 = whole context), got {self.window}")
        if self.max_pos < 0:
            raise ValueError(f"LookupConfig: max_pos must be >= 0, got {self.max_pos}")


def n_bucket(n: int) -> int:
    return 0 if n <= 1 else 1 if n == 2 else 2 if n <= 4 else 3


_TOKEN_BITS = 32
_TOKEN_MASK = (1 << _TOKEN_BITS) - 1


def gram_key(gram: Sequence[int]) -> int:
    """Exact int key of an n-gram (token ids < 2**32): tokens packed from the LAST one backwards."""
    key = 0
    for i, tok in enumerate(reversed(gram)):
        key |= (int(tok) & _TOKEN_MASK) << (_TOKEN_BITS * i)
    return key


@dataclass
class NgramIndex:
    """Incremental n-gram index of one token sequence.

    tokens: the sequence so far. last[n][gram_key(g)] = 4 * e + agreement, e the end index (exclusive) of the most
    recent occurrence tokens[e-n:e] == g with e < len(tokens) (so tokens[e] is its known continuation); agreement
    0: no earlier occurrence, 1: the previous occurrence continued differently, 2: it continued the same way.
    window W > 0: only end positions e > len(tokens) - 1 - W stay indexed, and "earlier occurrence" means one within
    the W positions before e (entries leaving the window are deleted). Memory: about max_n dict entries per indexed
    end position (packed int keys, one dict per n); 0 = no window.
    """

    min_n: int
    max_n: int
    window: int = 0
    tokens: list[int] = field(default_factory=list)
    last: dict[int, dict[int, int]] = field(default_factory=dict)
    n_indexed: int = 0  # end positions e in [first_indexed, n_indexed] were indexed (minus evictions)
    first_indexed: int = 1

    def __post_init__(self) -> None:
        for n in range(self.min_n, self.max_n + 1):
            self.last.setdefault(n, {})

    def _keys(self, e: int):
        """(n, key) of every indexed n-gram size ending at e."""
        toks = self.tokens
        key = 0
        for n in range(1, min(self.max_n, e) + 1):
            key |= (toks[e - n] & _TOKEN_MASK) << (_TOKEN_BITS * (n - 1))
            if n >= self.min_n:
                yield n, key

    def _evict(self, e: int) -> None:
        for n, key in self._keys(e):
            last_n = self.last[n]
            value = last_n.get(key)
            if value is not None and value >> 2 == e:
                del last_n[key]

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens and index every n-gram whose continuation is now known: O(len(new_tokens) * max_n) (with a
        window, O(min(len(new_tokens), 2 W) * max_n): a long prompt indexes only what the window can keep)."""
        toks = self.tokens
        toks.extend(int(t) for t in new_tokens)
        end = len(toks) - 1  # the last end position with a known continuation
        W = self.window
        start = max(self.n_indexed + 1, 1)
        if W and end - 2 * W + 1 > start:  # positions that could not even serve as an earlier occurrence
            start = self.first_indexed = end - 2 * W + 1
            for last_n in self.last.values():  # everything indexed so far is out of the window now
                last_n.clear()
        for e in range(start, end + 1):
            if W and e - W >= self.first_indexed:
                self._evict(e - W)
            nxt = toks[e]
            for n, key in self._keys(e):
                last_n = self.last[n]
                old = last_n.get(key)
                agreement = 0 if old is None else (2 if toks[old >> 2] == nxt else 1)
                last_n[key] = 4 * e + agreement
        self.n_indexed = max(self.n_indexed, end)

    def num_entries(self) -> int:
        return sum(len(d) for d in self.last.values())

    def match(self) -> tuple[int, int, int] | None:
        """(n, e, agreement) of the longest suffix n-gram with an earlier occurrence ending at e, or None."""
        toks = self.tokens
        L = len(toks)
        top = min(self.max_n, L - 1)
        keys = []
        key = 0
        for n in range(1, top + 1):
            key |= (toks[L - n] & _TOKEN_MASK) << (_TOKEN_BITS * (n - 1))
            keys.append(key)
        for n in range(top, self.min_n - 1, -1):
            value = self.last[n].get(keys[n - 1])
            if value is not None:
                return n, value >> 2, value & 3
        return None


@dataclass
class _RequestState:
    index: NgramIndex
    n_prompt: int
    n_output: int = 0  # output tokens already appended to the index
    last_buckets: list[tuple[int, ...]] = field(default_factory=list)
    last_conf: list[float] = field(default_factory=list)


class LookupDrafter:
    """Drafter protocol over a per-request NgramIndex and a shared BetaBucketCalibrator."""

    def __init__(self, config: LookupConfig | None = None, calibrator: BetaBucketCalibrator | None = None) -> None:
        self.config = config or LookupConfig()
        self.calibrator = calibrator or BetaBucketCalibrator(CalibratorConfig())
        self._states: dict[str, _RequestState] = {}

    def _state(self, req: DraftRequest) -> _RequestState:
        st = self._states.get(req.rid)
        if st is None or len(req.output) < st.n_output:
            st = _RequestState(index=NgramIndex(self.config.min_n, self.config.max_n, self.config.window),
                               n_prompt=len(req.prompt))
            st.index.extend(req.prompt)
            self._states[req.rid] = st
        if len(req.output) > st.n_output:
            st.index.extend(req.output[st.n_output:])
            st.n_output = len(req.output)
        return st

    def _draft_one(self, st: _RequestState, gamma: int) -> tuple[list[int], list[tuple[int, ...]]]:
        found = st.index.match()
        if found is None:
            return [], []
        n, e, agreement = found
        toks = st.index.tokens
        L = len(toks)
        nb = n_bucket(n)
        drafts: list[int] = []
        buckets: list[tuple[int, ...]] = []
        for j in range(gamma):
            src = e + j
            drafts.append(toks[src] if src < L else drafts[src - L])
            source = 0 if src < st.n_prompt else 1
            buckets.append((min(j, self.config.max_pos), nb, source, agreement))
        return drafts, buckets

    def propose(self, requests: Sequence[DraftRequest], gamma: int) -> DraftBlock:
        """tokens/conf [N, gamma], n_drafted [N]; conf[b, j] = calibrated q of draft j's bucket."""
        check_gamma(gamma)
        block = DraftBlock.empty(len(requests), gamma)
        for b, req in enumerate(requests):
            st = self._state(req)
            drafts, buckets = self._draft_one(st, gamma)
            conf = [self.calibrator.estimate(k) for k in buckets]
            st.last_buckets, st.last_conf = buckets, conf
            k = len(drafts)
            if k:
                block.tokens[b, :k] = drafts
                block.conf[b, :k] = conf
                block.n_drafted[b] = k
        return block

    def observe(self, rid: str, n_verified: int, n_accepted: int) -> None:
        st = self._states.get(rid)
        if st is None:
            return
        check_observation(n_verified, n_accepted, len(st.last_buckets))
        self.calibrator.update(st.last_buckets, n_verified, n_accepted, predicted=st.last_conf)
        st.last_buckets, st.last_conf = [], []

    def release(self, rid: str) -> None:
        self._states.pop(rid, None)

    def num_tracked(self) -> int:
        return len(self._states)


def reference_match(tokens: Sequence[int], min_n: int, max_n: int, window: int = 0) -> tuple[int, int, int] | None:
    """From-scratch reference of NgramIndex.match: O(L * max_n) scan (tests only). window W > 0: occurrences end in
    the last W positions with a known continuation, and the agreement looks at most W positions back from e."""
    toks = list(tokens)
    L = len(toks)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        gram = toks[L - n:]
        ends = [e for e in range(n, L) if toks[e - n:e] == gram]
        if window:
            in_window = [e for e in ends if e >= L - window]
            if not in_window:
                continue
            e = in_window[-1]
            ends = [x for x in ends if e - window < x <= e]
        if ends:
            e = ends[-1]
            agreement = 0 if len(ends) == 1 else (2 if toks[ends[-2]] == toks[e] else 1)
            return n, e, agreement
    return None

