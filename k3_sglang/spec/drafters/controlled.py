"""A test drafter with a known error rate: replays a reference greedy continuation, corrupting drafts at rate 1 - q.

Oracle: a JSONL file, one {"input_ids": [...], "output_ids": [...]} object per line, written by a no-spec run of
the same prompts (so it is also the lossless reference). For a request whose prompt is in the oracle and whose
committed output equals ref[:len(output)], the drafts are ref[len(output) : len(output) + gamma] (the continuation
after the root output[-1]); draft at absolute output position p is corrupted (token -> (token + 1) % vocab_size)
when u(prompt hash, p, seed) > q, with u a deterministic hash uniform in [0, 1). The reported confidence is q, which
is exactly calibrated when the target reproduces the reference. A diverged or unknown request gets no drafts;
divergence is permanent (committed history cannot realign).

q per request comes from a profile, drawn by the prompt hash: "chat" 0.64, "math" 0.86 (K3's reported accept
lengths 2.7 / 5.0 at gamma=7 as 1 + sum q^i), "mix" 30 % math / 70 % chat, "perfect" 1.0, "zero" 0.0, or a number.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from k3_sglang.spec.drafters.base import DraftBlock, DraftRequest, check_gamma, check_observation

PROFILE_Q = {"chat": 0.64, "math": 0.86, "perfect": 1.0, "zero": 0.0}
MIX_MATH_FRACTION = 0.3
_MASK64 = (1 << 64) - 1


def prompt_hash(prompt: Sequence[int]) -> int:
    """64-bit hash of a token sequence (stable across processes)."""
    data = np.asarray(list(prompt), dtype="<i8").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_MASK64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_uniform(phash: int, positions: np.ndarray, seed: int) -> np.ndarray:
    """[P] float64 in [0, 1): deterministic uniforms of (prompt hash, absolute position, seed)."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([phash ^ ((seed * 0x632BE59BD9B4E019) & _MASK64)], dtype=np.uint64))
        x = _splitmix64(key ^ np.asarray(positions, dtype=np.uint64))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass(frozen=True)
class ControlledConfig:
    """profile: chat | math | mix | perfect | zero | a number in [0, 1]; vocab_size > 0 for corruption."""

    profile: str = "mix"
    seed: int = 0
    vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size <= 0:
            raise ValueError(f"controlled drafter: vocab_size must be > 0 (corruption wraps mod vocab), got {self.vocab_size}")
        if self.profile not in PROFILE_Q and self.profile != "mix":
            try:
                q = float(self.profile)
            except ValueError:
                raise ValueError(
                    f"controlled drafter: profile must be chat, math, mix, perfect, zero or a number, got {self.profile!r}"
                ) from None
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"controlled drafter: profile q must be in [0, 1], got {q}")

    def q_for(self, phash: int) -> float:
        """The request's constant conditional acceptance."""
        if self.profile in PROFILE_Q:
            return PROFILE_Q[self.profile]
        if self.profile == "mix":
            u = float(hash_uniform(phash, np.array([_MASK64]), self.seed)[0])
            return PROFILE_Q["math"] if u < MIX_MATH_FRACTION else PROFILE_Q["chat"]
        return float(self.profile)


def load_oracle(path: str) -> dict[int, tuple[tuple[int, ...], list[int]]]:
    """prompt hash -> (input_ids, output_ids) from a JSONL file; clear ValueError on a bad file or line."""
    if not path or not os.path.isfile(path):
        raise ValueError(f"controlled drafter: oracle file not found: {path!r}")
    oracle: dict[int, tuple[tuple[int, ...], list[int]]] = {}
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ids, out = obj["input_ids"], obj["output_ids"]
                if not (isinstance(ids, list) and isinstance(out, list)):
                    raise TypeError("input_ids and output_ids must be lists")
                ids_t = tuple(int(t) for t in ids)
                out_l = [int(t) for t in out]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"controlled drafter: {path}:{lineno}: bad oracle line ({exc!r})") from None
            h = prompt_hash(ids_t)
            if h in oracle and oracle[h][1] != out_l:
                raise ValueError(f"controlled drafter: {path}:{lineno}: prompt repeated with a different output")
            oracle[h] = (ids_t, out_l)
    if not oracle:
        raise ValueError(f"controlled drafter: oracle file {path} has no lines")
    return oracle


@dataclass
class _RequestState:
    ref: list[int] | None  # None: unknown prompt
    phash: int
    q: float
    n_checked: int = 0
    diverged: bool = False
    last_drafted: int = 0
    counts: list[int] = field(default_factory=lambda: [0, 0])  # [verified positions counted, accepted]


class ControlledDrafter:
    """Drafter protocol replaying oracle continuations with a known per-request acceptance q."""

    def __init__(self, oracle: dict, config: ControlledConfig) -> None:
        self.oracle = oracle
        self.config = config
        self._states: dict[str, _RequestState] = {}

    @classmethod
    def from_file(cls, path: str, config: ControlledConfig) -> "ControlledDrafter":
        return cls(load_oracle(path), config)

    def _state(self, req: DraftRequest) -> _RequestState:
        st = self._states.get(req.rid)
        if st is None:
            h = prompt_hash(req.prompt)
            entry = self.oracle.get(h)
            ref = entry[1] if entry is not None and entry[0] == tuple(int(t) for t in req.prompt) else None
            st = self._states[req.rid] = _RequestState(ref=ref, phash=h, q=self.config.q_for(h))
        if st.ref is not None and not st.diverged:
            n = len(req.output)
            if n < st.n_checked or n > len(st.ref):
                st.diverged = True
            elif n > st.n_checked:
                new = [int(t) for t in req.output[st.n_checked:n]]
                st.diverged = new != st.ref[st.n_checked:n]
                st.n_checked = n
        return st

    def propose(self, requests: Sequence[DraftRequest], gamma: int) -> DraftBlock:
        """tokens/conf [N, gamma], n_drafted [N]: the reference continuation, corrupted where u > q; conf = q."""
        check_gamma(gamma)
        block = DraftBlock.empty(len(requests), gamma)
        vocab = self.config.vocab_size
        for b, req in enumerate(requests):
            st = self._state(req)
            st.last_drafted = 0
            if st.ref is None or st.diverged:
                continue
            start = len(req.output)
            drafts = np.asarray(st.ref[start:start + gamma], dtype=np.int64)
            k = drafts.size
            if not k:
                continue
            u = hash_uniform(st.phash, np.arange(start, start + k), self.config.seed)
            drafts = np.where(u > st.q, (drafts + 1) % vocab, drafts)
            block.tokens[b, :k] = drafts
            block.conf[b, :k] = st.q
            block.n_drafted[b] = k
            st.last_drafted = k
        return block

    def observe(self, rid: str, n_verified: int, n_accepted: int) -> None:
        """Counts the conditional acceptance actually seen (for reports); does not change proposals."""
        st = self._states.get(rid)
        if st is None:
            return
        check_observation(n_verified, n_accepted, st.last_drafted)
        st.counts[0] += n_accepted + (1 if n_accepted < n_verified else 0)
        st.counts[1] += n_accepted

    def release(self, rid: str) -> None:
        self._states.pop(rid, None)

    def q_of(self, rid: str) -> float | None:
        st = self._states.get(rid)
        return None if st is None else st.q
