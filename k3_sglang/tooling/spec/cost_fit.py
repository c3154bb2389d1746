"""Fitting the affine step-cost model from measured steps (`k3 bench profile-verify`): non-negative least squares."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from k3_sglang.spec.cost import AffineCost, CostModel, step_seconds


@dataclass(frozen=True)
class StepSample:
    """One measured step: kind "verify" or "decode", its request and token counts, longest chain, wall seconds."""

    kind: str
    n_reqs: int
    n_tokens: int
    l_max: int
    seconds: float

    def __post_init__(self) -> None:
        if self.kind not in ("verify", "decode"):
            raise ValueError(f"StepSample kind must be 'verify' or 'decode', got {self.kind!r}")
        if self.n_reqs < 1 or self.n_tokens < self.n_reqs or self.l_max < 1:
            raise ValueError(f"StepSample needs n_reqs >= 1, n_tokens >= n_reqs, l_max >= 1; got n_reqs="
                             f"{self.n_reqs} n_tokens={self.n_tokens} l_max={self.l_max}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"StepSample seconds must be finite and > 0, got {self.seconds}")


def _nnls_small(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, exactly, for a [M, P] with small P (enumerates the 2^P supports)."""
    best, best_res = np.zeros(a.shape[1]), float(np.sum(b * b))
    for r in range(1, a.shape[1] + 1):
        for support in itertools.combinations(range(a.shape[1]), r):
            cols = list(support)
            x_s, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_s < 0):
                continue
            x = np.zeros(a.shape[1])
            x[cols] = x_s
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res - 1e-18 * max(1.0, best_res):
                best, best_res = x, res
    return best


def _fit_block(rows: np.ndarray, secs: np.ndarray, names: list[str], what: str) -> np.ndarray:
    need = rows.shape[1]
    if rows.shape[0] < need:
        raise ValueError(f"fit_affine: {rows.shape[0]} {what} samples, need at least {need} to fit {', '.join(names)}")
    rank = np.linalg.matrix_rank(rows)
    if rank < need:
        raise ValueError(f"fit_affine: {what} samples are degenerate (design rank {rank} < {need} for "
                         f"{', '.join(names)}); vary " + ("n_reqs, n_tokens and l_max independently (add ragged "
                                                          "mixes)" if what == "verify" else "n_reqs"))
    scale = np.maximum(np.abs(rows).max(axis=0), 1e-12)  # column scaling keeps the small solves well conditioned
    return _nnls_small(rows / scale, secs) / scale


def fit_affine(samples: Iterable[StepSample], fit_lmax: bool = True) -> AffineCost:
    """Non-negative least-squares AffineCost from measured steps.

    Verify samples fit (c0, c_req, c_tok, c_lmax) (c_lmax fixed at 0 when fit_lmax is False), decode samples fit
    (d0, d_req), each separately; a coefficient the data would make negative is clamped to 0 and the others are
    refit (exact NNLS), so the model stays monotone. ValueError on too few or degenerate samples.
    """
    samples = list(samples)
    ver = [s for s in samples if s.kind == "verify"]
    dec = [s for s in samples if s.kind == "decode"]
    v_names = ["c0", "c_req", "c_tok"] + (["c_lmax"] if fit_lmax else [])
    v_rows = np.array([[1.0, s.n_reqs, s.n_tokens] + ([s.l_max] if fit_lmax else []) for s in ver],
                      dtype=np.float64).reshape(len(ver), len(v_names))
    c = _fit_block(v_rows, np.array([s.seconds for s in ver]), v_names, "verify")
    d_rows = np.array([[1.0, s.n_reqs] for s in dec], dtype=np.float64).reshape(len(dec), 2)
    d = _fit_block(d_rows, np.array([s.seconds for s in dec]), ["d0", "d_req"], "decode")
    c_lmax = float(c[3]) if fit_lmax else 0.0
    return AffineCost(c0=float(c[0]), c_req=float(c[1]), c_tok=float(c[2]), c_lmax=c_lmax,
                      d0=float(d[0]), d_req=float(d[1]))


def relative_residuals(cost: CostModel, samples: Iterable[StepSample]) -> np.ndarray:
    """(predicted - measured) / measured [M] for each sample, verify via step(), decode via decode()."""
    out = []
    for s in samples:
        pred = cost.decode(s.n_reqs) if s.kind == "decode" else cost.step(s.n_reqs, s.n_tokens, s.l_max)
        out.append((pred - s.seconds) / s.seconds)
    return np.asarray(out, dtype=np.float64)



# ---- JSON files -----------------------------------------------------------------------------------------------
