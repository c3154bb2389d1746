"""Online Beta-bucket estimator of a drafter's conditional acceptance (pure python + numpy, deterministic).

For a feature bucket k (a tuple of small ints, e.g. (position, matched-n bucket, source, agreement)) it estimates
q_k = P(draft at this position accepted | all earlier drafts of the block accepted) with a Beta(a0, b0) prior:

    q_k = (a0 + s_k) / (a0 + b0 + s_k + f_k) + bonus / sqrt(1 + s_k + f_k)        (clipped to [0, 1])

s_k / f_k are exponentially forgotten success / failure counts. With `pooled` (the default) the prior of a bucket is
not a fixed Beta(a0, b0) but one of the same strength centred on its group's rate (the group is the bucket's first
feature, the draft position): q_k = (kappa m_g + s_k) / (kappa + s_k + f_k) + bonus / sqrt(1 + s_k + f_k), with
kappa = a0 + b0 and m_g = (a0 + S_g) / (a0 + b0 + S_g + F_g) over the group's pooled counts. A bucket seen for the
first time starts at what its position has earned so far rather than at a0 / (a0 + b0): on traffic where lookup
drafts are never accepted, each new feature combination costs no exploratory verify step on its own.

Only VERIFIED positions update the counts: for a block whose first n_verified drafts were verified and first
n_accepted accepted, positions 0..n_accepted-1 are successes, position n_accepted is one failure if it was
verified, and everything after it (rejected prefix, or never verified) is censored and not counted.
Censoring therefore does not bias the conditional estimate.

Forgetting is per observation: every counted position multiplies all buckets' counts by `forgetting` (applied
lazily, so an update is O(1) in the number of buckets). The optimism bonus keeps rarely-verified buckets from
starving themselves of data (exploration); it is 0 by default.

A reliability histogram of (predicted q at proposal time, outcome) over the counted positions gives ECE.
The posterior saves to / loads from JSON (the K3_SPEC_PRIOR file).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

Bucket = tuple[int, ...]
_FORMAT = "k3-spec-calibrator/1"


@dataclass(frozen=True)
class CalibratorConfig:
    """a0/b0: Beta prior; forgetting in (0, 1] per counted observation; bonus >= 0 optimism; bins for ECE;
    pooled: a bucket's prior is centred on its position group's pooled rate (module docstring)."""

    a0: float = 1.0
    b0: float = 1.0
    forgetting: float = 0.999
    bonus: float = 0.0
    bins: int = 10
    pooled: bool = True

    def __post_init__(self) -> None:
        if not (self.a0 > 0 and self.b0 > 0):
            raise ValueError(f"CalibratorConfig: prior a0, b0 must be > 0, got {self.a0}, {self.b0}")
        if not 0.0 < self.forgetting <= 1.0:
            raise ValueError(f"CalibratorConfig: forgetting must be in (0, 1], got {self.forgetting}")
        if self.bonus < 0:
            raise ValueError(f"CalibratorConfig: bonus must be >= 0, got {self.bonus}")
        if self.bins < 1:
            raise ValueError(f"CalibratorConfig: bins must be >= 1, got {self.bins}")


def expected_calibration_error(pred: np.ndarray, outcome: np.ndarray, bins: int = 10) -> float:
    """ECE of predictions pred [M] in [0, 1] against 0/1 outcomes [M]: sum_b (n_b / M) |mean pred_b - mean out_b|."""
    pred = np.asarray(pred, dtype=np.float64)
    outcome = np.asarray(outcome, dtype=np.float64)
    if pred.shape != outcome.shape or pred.ndim != 1:
        raise ValueError(f"expected_calibration_error: pred {pred.shape} and outcome {outcome.shape} must be [M]")
    if pred.size == 0:
        return 0.0
    idx = np.minimum((pred * bins).astype(np.int64), bins - 1)
    n = np.bincount(idx, minlength=bins).astype(np.float64)
    sp = np.bincount(idx, weights=pred, minlength=bins)
    so = np.bincount(idx, weights=outcome, minlength=bins)
    return float(np.abs(sp - so).sum() / pred.size)


class BetaBucketCalibrator:
    """Conditional-acceptance estimator per feature bucket; see the module docstring."""

    def __init__(self, config: CalibratorConfig | None = None) -> None:
        self.config = config or CalibratorConfig()
        self._counts: dict[Bucket, list[float]] = {}  # bucket -> [successes, failures, clock at last decay]
        self._groups: dict[Bucket, list[float]] = {}  # bucket[:1] -> the same, pooled over its buckets
        self._clock = 0  # counted observations so far
        bins = self.config.bins
        self._rel_n = np.zeros(bins)
        self._rel_pred = np.zeros(bins)
        self._rel_out = np.zeros(bins)

    # -- estimates ---------------------------------------------------------------------------------------------
    def _decayed(self, bucket: Bucket, table: dict | None = None) -> tuple[float, float]:
        entry = (self._counts if table is None else table).get(bucket)
        if entry is None:
            return 0.0, 0.0
        lam = self.config.forgetting
        if lam < 1.0 and entry[2] != self._clock:
            scale = lam ** (self._clock - entry[2])
            entry[0] *= scale
            entry[1] *= scale
            entry[2] = self._clock
        return entry[0], entry[1]

    def counts(self, bucket: Bucket) -> tuple[float, float]:
        """(successes, failures) of a bucket after forgetting."""
        return self._decayed(tuple(bucket))

    def group_counts(self, bucket: Bucket) -> tuple[float, float]:
        """(successes, failures) pooled over every bucket sharing this bucket's first feature, after forgetting."""
        return self._decayed(tuple(bucket)[:1], self._groups)

    def prior_mean(self, bucket: Bucket) -> float:
        """The mean a bucket's posterior starts from: a0 / (a0 + b0), or its group's pooled rate when pooled."""
        c = self.config
        if not c.pooled:
            return c.a0 / (c.a0 + c.b0)
        s, f = self.group_counts(bucket)
        return (c.a0 + s) / (c.a0 + c.b0 + s + f)

    def estimate(self, bucket: Bucket) -> float:
        """Conditional acceptance q in [0, 1] of one bucket (posterior mean + optimism bonus)."""
        bucket = tuple(bucket)
        s, f = self._decayed(bucket)
        c = self.config
        kappa = c.a0 + c.b0
        q = (kappa * self.prior_mean(bucket) + s) / (kappa + s + f)
        if c.bonus:
            q += c.bonus / math.sqrt(1.0 + s + f)
        return min(1.0, max(0.0, q))

    def estimate_many(self, buckets: Sequence[Bucket]) -> np.ndarray:
        """[len(buckets)] float64 estimates."""
        return np.array([self.estimate(b) for b in buckets], dtype=np.float64)

    # -- updates -----------------------------------------------------------------------------------------------
    def _count(self, bucket: Bucket, success: bool, predicted: float | None) -> None:
        group = bucket[:1]
        self._decayed(bucket)  # bring both entries to the current clock before the global decay step
        self._decayed(group, self._groups)
        self._clock += 1
        lam = self.config.forgetting
        for table, key in ((self._counts, bucket), (self._groups, group)):
            entry = table.get(key)
            if entry is None:
                entry = table[key] = [0.0, 0.0, self._clock]
            else:
                entry[0] *= lam
                entry[1] *= lam
                entry[2] = self._clock
            entry[0 if success else 1] += 1.0
        if predicted is not None:
            b = min(int(predicted * self.config.bins), self.config.bins - 1)
            self._rel_n[b] += 1
            self._rel_pred[b] += predicted
            self._rel_out[b] += float(success)

    def update(
        self,
        buckets: Sequence[Bucket],
        n_verified: int,
        n_accepted: int,
        predicted: Sequence[float] | None = None,
    ) -> int:
        """Count one verified block: buckets [n_drafted] of its drafts, predicted [n_drafted] (optional) the q
        issued at proposal time. Returns how many positions were counted (n_accepted, +1 for the failure)."""
        if not 0 <= n_accepted <= n_verified <= len(buckets):
            raise ValueError(
                f"update: need 0 <= n_accepted ({n_accepted}) <= n_verified ({n_verified}) <= {len(buckets)} drafts"
            )
        for j in range(n_accepted):
            self._count(tuple(buckets[j]), True, None if predicted is None else float(predicted[j]))
        if n_accepted < n_verified:
            j = n_accepted
            self._count(tuple(buckets[j]), False, None if predicted is None else float(predicted[j]))
            return n_accepted + 1
        return n_accepted

    # -- calibration report ------------------------------------------------------------------------------------
    def reliability(self) -> list[dict]:
        """Reliability bins over counted positions: [{lo, hi, count, mean_pred, mean_outcome}] (empty bins kept)."""
        out = []
        nb = self.config.bins
        for b in range(nb):
            n = self._rel_n[b]
            out.append({
                "lo": b / nb, "hi": (b + 1) / nb, "count": int(n),
                "mean_pred": float(self._rel_pred[b] / n) if n else None,
                "mean_outcome": float(self._rel_out[b] / n) if n else None,
            })
        return out

    def ece(self) -> float:
        """Expected calibration error of the predictions passed to update() (0 when nothing was recorded)."""
        total = self._rel_n.sum()
        if not total:
            return 0.0
        return float(np.abs(self._rel_pred - self._rel_out).sum() / total)

    # -- persistence -------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The posterior (decayed to now) and config as a JSON-able dict."""
        buckets = []
        for key in sorted(self._counts):
            s, f = self._decayed(key)
            buckets.append({"bucket": list(key), "successes": s, "failures": f})
        c = self.config
        return {"format": _FORMAT, "a0": c.a0, "b0": c.b0, "forgetting": c.forgetting, "bonus": c.bonus,
                "bins": c.bins, "pooled": c.pooled, "buckets": buckets}

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)

    @classmethod
    def from_json(cls, data: dict) -> "BetaBucketCalibrator":
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"calibrator prior: expected a JSON object with format {_FORMAT!r}")
        try:
            config = CalibratorConfig(a0=float(data["a0"]), b0=float(data["b0"]),
                                      forgetting=float(data["forgetting"]), bonus=float(data["bonus"]),
                                      bins=int(data["bins"]), pooled=data.get("pooled", True))
            if not isinstance(config.pooled, bool):
                raise ValueError(f"'pooled' must be true or false, got {config.pooled!r}")
            cal = cls(config)
            for item in data["buckets"]:
                s, f = float(item["successes"]), float(item["failures"])
                if s < 0 or f < 0 or not (math.isfinite(s) and math.isfinite(f)):
                    raise ValueError(f"negative or non-finite counts {s}, {f}")
                key = tuple(int(x) for x in item["bucket"])
                cal._counts[key] = [s, f, 0]
                group = cal._groups.setdefault(key[:1], [0.0, 0.0, 0])  # a group's counts are its buckets' sums
                group[0] += s
                group[1] += f
        except (KeyError, TypeError) as exc:
            raise ValueError(f"calibrator prior: missing or malformed field ({exc})") from None
        return cal

    @classmethod
    def load(cls, path: str) -> "BetaBucketCalibrator":
        try:
            with open(path) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"calibrator prior: no such file {path}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"calibrator prior: {path} is not JSON ({exc})") from None
        return cls.from_json(data)

    def buckets(self) -> Iterable[Bucket]:
        return list(self._counts)
