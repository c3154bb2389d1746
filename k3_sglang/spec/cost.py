"""Step-cost models of a speculative verify step and of a plain decode step (pure: python + numpy).

A verify step runs `n_reqs` requests with `n_tokens` tokens in total (every request's root token counts, so
n_tokens >= n_reqs) and a longest per-request chain of `l_max` tokens; a decode step runs one token per request.
The planner (spec/planner.py) asks a CostModel for the seconds of both and maximises committed tokens per second.

- AffineCost: step = c0 + c_req*N + c_tok*T + c_lmax*L; decode = d0 + d_req*N (the CPU shape, docs/bench-serve.md).
- StaircaseCost: a dense staircase in total tokens (GPU graph tiers): seconds at the smallest edge >= T.
- AdditiveCost: SGLang DSpark's SpsAdditiveCostTable (bias + interp(alpha, N) + interp(theta, T)).
- fit_affine (k3_sglang/tooling/spec/cost_fit.py): non-negative least squares over measured StepSample rows (`k3 bench profile-verify`).
- save_cost / load_cost: JSON {"schema": "k3-verify-cost/v1", "kind": ..., ..., "meta": {...}}; load_cost also
  reads SGLang 0.5.23 DSpark SPS JSON (SpsCostTable, SpsAdditiveCostTable; srt/speculative/dspark_components/
  dspark_sps.py) and refuses a sparse floor-lookup SpsCostTable, which would price tokens between probes as free.

Every model also has `step_many(n_reqs, n_tokens [K], l_max [K]) -> seconds [K]`, the vectorised form the
planner uses; `step_seconds` falls back to a loop for a CostModel without it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

SCHEMA = "k3-verify-cost/v1"
KINDS = ("affine", "staircase", "additive")


@runtime_checkable
class CostModel(Protocol):
    def step(self, n_reqs: int, n_tokens: int, l_max: int) -> float:
        """Seconds of one verify step: n_reqs requests, n_tokens verified tokens in total, longest chain l_max."""
        ...

    def decode(self, n_reqs: int) -> float:
        """Seconds of one plain decode step (one token per request)."""
        ...


def _check_step_args(n_reqs: int, n_tokens, l_max) -> None:
    if n_reqs < 1:
        raise ValueError(f"a step needs n_reqs >= 1, got {n_reqs}")
    t = np.asarray(n_tokens)
    ell = np.asarray(l_max)
    if np.any(t < n_reqs):
        raise ValueError(f"n_tokens must be >= n_reqs={n_reqs} (each root token counts), got min {t.min()}")
    if np.any(ell < 1):
        raise ValueError(f"l_max must be >= 1, got min {ell.min()}")


def step_seconds(cost: CostModel, n_reqs: int, n_tokens: np.ndarray, l_max: np.ndarray) -> np.ndarray:
    """Seconds [K] float64 of K candidate verify steps (n_tokens [K], l_max [K] ints) with n_reqs requests."""
    many = getattr(cost, "step_many", None)
    if many is not None:
        return np.asarray(many(n_reqs, n_tokens, l_max), dtype=np.float64)
    return np.array([cost.step(n_reqs, int(t), int(ell)) for t, ell in zip(n_tokens, l_max)], dtype=np.float64)


def _finite_nonneg(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


@dataclass(frozen=True)
class AffineCost:
    """step(N, T, L) = c0 + c_req*N + c_tok*T + c_lmax*L seconds; decode(N) = d0 + d_req*N seconds."""

    c0: float
    c_req: float
    c_tok: float
    c_lmax: float
    d0: float
    d_req: float

    def __post_init__(self) -> None:
        for name in ("c0", "c_req", "c_tok", "c_lmax", "d0", "d_req"):
            _finite_nonneg(name, getattr(self, name))
        if self.c0 + self.c_req + self.c_tok + self.c_lmax <= 0:
            raise ValueError("AffineCost verify coefficients are all 0: a verify step would take no time")
        if self.d0 + self.d_req <= 0:
            raise ValueError("AffineCost decode coefficients d0 and d_req are both 0: decoding would take no time")

    def step(self, n_reqs: int, n_tokens: int, l_max: int) -> float:
        _check_step_args(n_reqs, n_tokens, l_max)
        return self.c0 + self.c_req * n_reqs + self.c_tok * n_tokens + self.c_lmax * l_max

    def step_many(self, n_reqs: int, n_tokens: np.ndarray, l_max: np.ndarray) -> np.ndarray:
        """Seconds [K] of step(n_reqs, n_tokens[k], l_max[k])."""
        _check_step_args(n_reqs, n_tokens, l_max)
        t = np.asarray(n_tokens, dtype=np.float64)
        ell = np.asarray(l_max, dtype=np.float64)
        return self.c0 + self.c_req * n_reqs + self.c_tok * t + self.c_lmax * ell

    def decode(self, n_reqs: int) -> float:
        if n_reqs < 1:
            raise ValueError(f"a decode step needs n_reqs >= 1, got {n_reqs}")
        return self.d0 + self.d_req * n_reqs

    def to_dict(self) -> dict:
        return {"kind": "affine", "c0": self.c0, "c_req": self.c_req, "c_tok": self.c_tok, "c_lmax": self.c_lmax,
                "d0": self.d0, "d_req": self.d_req}


@dataclass(frozen=True)
class StaircaseCost:
    """A dense staircase in total tokens: step(N, T, L) = seconds[i] for the smallest edges[i] >= T.

    edges [E] strictly increasing ints >= 1 (e.g. the graph token tiers a step is padded up to), seconds [E]
    positive, non-decreasing. decode(N) = step(N, N, 1). A step beyond the last edge is outside the measured
    table: step() returns inf there (the planner never picks it) and decode() raises ValueError.
    """

    edges: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        edges = tuple(int(e) for e in self.edges)
        secs = tuple(float(s) for s in self.seconds)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "seconds", secs)
        if not edges:
            raise ValueError("StaircaseCost needs at least one edge")
        if len(edges) != len(secs):
            raise ValueError(f"StaircaseCost edges and seconds differ in length: {len(edges)} vs {len(secs)}")
        if edges[0] < 1:
            raise ValueError(f"StaircaseCost edges must be >= 1 token, got first edge {edges[0]}")
        bad = [i for i in range(1, len(edges)) if edges[i] <= edges[i - 1]]
        if bad:
            i = bad[0]
            raise ValueError(f"StaircaseCost edges must be strictly increasing (sorted, no duplicates): "
                             f"edges[{i - 1}]={edges[i - 1]} >= edges[{i}]={edges[i]}")
        for i, s in enumerate(secs):
            if not math.isfinite(s) or s <= 0:
                raise ValueError(f"StaircaseCost seconds must be finite and > 0, got seconds[{i}]={s}")
        down = [i for i in range(1, len(secs)) if secs[i] < secs[i - 1]]
        if down:
            i = down[0]
            raise ValueError(f"StaircaseCost seconds must not decrease with tokens: seconds[{i}]={secs[i]} < "
                             f"seconds[{i - 1}]={secs[i - 1]} (edges {edges[i]} vs {edges[i - 1]})")

    @property
    def max_tokens(self) -> int:
        return self.edges[-1]

    def step_many(self, n_reqs: int, n_tokens: np.ndarray, l_max: np.ndarray) -> np.ndarray:
        """Seconds [K]: the step at the smallest edge >= n_tokens[k]; inf beyond the last edge."""
        _check_step_args(n_reqs, n_tokens, l_max)
        t = np.atleast_1d(np.asarray(n_tokens, dtype=np.int64))
        idx = np.searchsorted(np.asarray(self.edges, dtype=np.int64), t, side="left")
        secs = np.append(np.asarray(self.seconds, dtype=np.float64), np.inf)
        return secs[idx]

    def step(self, n_reqs: int, n_tokens: int, l_max: int) -> float:
        return float(self.step_many(n_reqs, np.array([n_tokens]), np.array([l_max]))[0])

    def decode(self, n_reqs: int) -> float:
        if n_reqs < 1:
            raise ValueError(f"a decode step needs n_reqs >= 1, got {n_reqs}")
        if n_reqs > self.max_tokens:
            raise ValueError(f"decode of {n_reqs} requests is beyond the staircase's last edge "
                             f"({self.max_tokens} tokens); re-profile with larger batches")
        return self.step(n_reqs, n_reqs, 1)

    def to_dict(self) -> dict:
        return {"kind": "staircase", "edges": list(self.edges), "seconds": list(self.seconds)}


def _interp_clamped(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.interp(np.asarray(x, dtype=np.float64), xs, ys)  # np.interp clamps to the end values


@dataclass(frozen=True)
class AdditiveCost:
    """SGLang's SpsAdditiveCostTable: step(N, T, L) = bias + interp(alpha, N) + interp(theta, T), clamped at the
    probe ends (T = N + budget); decode(N) = step(N, N, 1). L is not modelled (0 weight)."""

    bias_seconds: float
    bs_probes: tuple[int, ...]
    alpha_seconds: tuple[float, ...]
    m_probes: tuple[int, ...]
    theta_seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("bs_probes", "alpha_seconds", "m_probes", "theta_seconds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, probes, values in (("bs", self.bs_probes, self.alpha_seconds),
                                     ("m", self.m_probes, self.theta_seconds)):
            if not probes:
                raise ValueError(f"additive cost table needs {name}_probes")
            if list(probes) != sorted(set(probes)):
                raise ValueError(f"additive cost table {name}_probes must be strictly increasing, got {list(probes)}")
            if len(probes) != len(values):
                raise ValueError(f"additive cost table {name}_probes and its values differ in length: "
                                 f"{len(probes)} vs {len(values)}")
            if not all(math.isfinite(float(v)) for v in values):
                raise ValueError(f"additive cost table values for {name}_probes must be finite")
        if not (math.isfinite(self.bias_seconds) and self.bias_seconds > 0):
            raise ValueError(f"additive cost table bias_seconds must be > 0, got {self.bias_seconds}")

    def step_many(self, n_reqs: int, n_tokens: np.ndarray, l_max: np.ndarray) -> np.ndarray:
        """Seconds [K] of bias + alpha(N) + theta(n_tokens[k])."""
        _check_step_args(n_reqs, n_tokens, l_max)
        alpha = _interp_clamped(np.asarray(self.bs_probes, float), np.asarray(self.alpha_seconds, float), n_reqs)
        theta = _interp_clamped(np.asarray(self.m_probes, float), np.asarray(self.theta_seconds, float),
                                np.atleast_1d(n_tokens))
        return self.bias_seconds + alpha + theta

    def step(self, n_reqs: int, n_tokens: int, l_max: int) -> float:
        return float(self.step_many(n_reqs, np.array([n_tokens]), np.array([l_max]))[0])

    def decode(self, n_reqs: int) -> float:
        return self.step(n_reqs, n_reqs, 1)

    def to_dict(self) -> dict:
        return {"kind": "additive", "bias_seconds": self.bias_seconds, "bs_probes": list(self.bs_probes),
                "alpha_seconds": list(self.alpha_seconds), "m_probes": list(self.m_probes),
                "theta_seconds": list(self.theta_seconds)}


def save_cost(model: CostModel, path, meta: dict) -> None:
    """Write `model` as {"schema": "k3-verify-cost/v1", "kind": ..., ...coefficients, "meta": meta}."""
    to_dict = getattr(model, "to_dict", None)
    if to_dict is None:
        raise ValueError(f"save_cost: {type(model).__name__} is not a k3 cost model (AffineCost, StaircaseCost, "
                         "AdditiveCost)")
    if not isinstance(meta, dict):
        raise ValueError(f"save_cost: meta must be a dict, got {type(meta).__name__}")
    doc = {"schema": SCHEMA, **to_dict(), "meta": meta}
    Path(path).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _require(path, doc: dict, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in doc]
    if missing:
        raise ValueError(f"{path}: {what} is missing field(s) {', '.join(missing)}")


def _number_list(path, doc: dict, key: str, integer: bool = False) -> list:
    value = doc[key]
    ok = isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if ok and integer:
        ok = all(float(v).is_integer() for v in value)
    if not ok:
        kind = "integers" if integer else "numbers"
        raise ValueError(f"{path}: field {key!r} must be a list of {kind}, got {value!r:.80}")
    return [int(v) for v in value] if integer else [float(v) for v in value]


def _number(path, doc: dict, key: str) -> float:
    value = doc[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{path}: field {key!r} must be a number, got {value!r:.80}")
    return float(value)


def _from_k3(path, doc: dict) -> CostModel:
    if doc["schema"] != SCHEMA:
        raise ValueError(f"{path}: unknown schema {doc['schema']!r}, expected {SCHEMA!r}")
    kind = doc.get("kind")
    if kind == "affine":
        keys = ("c0", "c_req", "c_tok", "c_lmax", "d0", "d_req")
        _require(path, doc, keys, "an affine cost")
        return AffineCost(**{k: _number(path, doc, k) for k in keys})
    if kind == "staircase":
        _require(path, doc, ("edges", "seconds"), "a staircase cost")
        return StaircaseCost(tuple(_number_list(path, doc, "edges", integer=True)),
                             tuple(_number_list(path, doc, "seconds")))
    if kind == "additive":
        return _from_sps_additive(path, doc)
    raise ValueError(f"{path}: unknown cost kind {kind!r}, expected one of {', '.join(KINDS)}")


def _from_sps_additive(path, doc: dict) -> AdditiveCost:
    keys = ("bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds")
    _require(path, doc, keys, "an additive cost table")
    return AdditiveCost(bias_seconds=_number(path, doc, "bias_seconds"),
                        bs_probes=tuple(_number_list(path, doc, "bs_probes", integer=True)),
                        alpha_seconds=tuple(_number_list(path, doc, "alpha_seconds")),
                        m_probes=tuple(_number_list(path, doc, "m_probes", integer=True)),
                        theta_seconds=tuple(_number_list(path, doc, "theta_seconds")))


def _from_sps_table(path, doc: dict) -> StaircaseCost:
    """SGLang's SpsCostTable (floor lookup over probes, steps/s) as a StaircaseCost (seconds at edges).

    The floor lookup prices T at the largest probe <= T, so a table is only faithful when its probes are
    consecutive token counts up to max_batch_tokens; then floor and ceiling lookups agree at every integer T and
    the table is a StaircaseCost with edges = probes. A sparse table is refused.
    """
    _require(path, doc, ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"), "an SPS cost table")
    probes = _number_list(path, doc, "sample_batch_tokens", integer=True)
    sps = _number_list(path, doc, "sample_steps_per_sec")
    max_tokens = int(_number(path, doc, "max_batch_tokens"))
    if not probes or len(probes) != len(sps):
        raise ValueError(f"{path}: SPS table needs equal-length, non-empty sample_batch_tokens and "
                         f"sample_steps_per_sec, got {len(probes)} and {len(sps)}")
    if probes != sorted(set(probes)):
        raise ValueError(f"{path}: SPS sample_batch_tokens must be strictly increasing, got {probes[:16]}")
    if len(probes) <= 1:
        raise ValueError(f"{path}: SPS table has a single probe (SGLang's uninitialised table, verify-all); "
                         "profile a real one")
    gaps = [(a, b) for a, b in zip(probes, probes[1:]) if b != a + 1]
    if gaps or max_tokens != probes[-1]:
        where = f"probes jump {gaps[0][0]} -> {gaps[0][1]}" if gaps else \
            f"max_batch_tokens {max_tokens} > last probe {probes[-1]}"
        raise ValueError(f"{path}: SPS table is sparse ({where}); its floor lookup would price the tokens between "
                         "probes as free. Profile every token count up to max_batch_tokens, or write a k3 "
                         "staircase (kind 'staircase', edges at the real token tiers)")
    if any(not math.isfinite(v) or v <= 0 for v in sps):
        raise ValueError(f"{path}: SPS sample_steps_per_sec must all be finite and > 0")
    return StaircaseCost(tuple(probes), tuple(1.0 / v for v in sps))


def load_cost_with_meta(path) -> tuple[CostModel, dict]:
    """(model, meta) from a k3 cost JSON or an SGLang DSpark SPS JSON (meta {"source": "sglang-sps"})."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read cost file ({exc.strerror or exc})") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a cost file must hold a JSON object, got {type(doc).__name__}")
    try:
        if "schema" in doc:
            meta = doc.get("meta", {})
            if not isinstance(meta, dict):
                raise ValueError(f"{path}: field 'meta' must be an object")
            return _from_k3(path, doc), meta
        if "bias_seconds" in doc:
            return _from_sps_additive(path, doc), {"source": "sglang-sps-additive"}
        if "sample_batch_tokens" in doc:
            return _from_sps_table(path, doc), {"source": "sglang-sps"}
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    raise ValueError(f"{path}: not a cost file: no 'schema' ({SCHEMA!r}) and not an SGLang SPS table "
                     "('sample_batch_tokens' or 'bias_seconds')")


def load_cost(path) -> CostModel:
    """The CostModel in `path` (see load_cost_with_meta); ValueError naming the file and the problem."""
    return load_cost_with_meta(path)[0]
