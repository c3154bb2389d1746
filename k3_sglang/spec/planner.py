"""The verify planner of K3_CSV: how many tokens each request verifies this step (pure: python + numpy).

Inputs per step: survival [N, G] float, survival[i, j] = P(drafts 0..j of request i are all accepted)
(non-increasing in j), and caps [N] int in 1..G+1, the most tokens request i may verify (its root token plus
its available drafts; cap 1 = no draft). Verifying a chain of v tokens commits 1 + (accepted drafts among the
first v-1) tokens, so a plan's expected committed tokens are N + the sum of the survivals of its verified cells.

Modes:
- "static": verify-all, verify_lens = caps (the verify-all baseline).
- "compact": DSpark's global argmax extended with caps, a floor and a longest-chain term. For every chain cap
  L = 1..G+1 and budget k = 0.. (number of eligible cells), theta_L(k) = (N + top-k survivals with j < min(caps,
  L) - 1) / cost.step(N, N + k, L_eff), where L_eff is the longest chain the plan really has. The plan is the
  argmax over (L, k) (ties: smaller k, then larger L), each request getting a prefix of cells (cells are
  ordered by value, then position, then request, as SGLang does). Then the never-slower rule: if the best
  theta < decode_tps * (1 + margin), or the plan verifies no draft at all, the step is a plain decode.
- "decode": always a plain decode step.
Cells with survival < survival_eps are never chosen. With an AffineCost whose c_lmax = 0 and no caps, the budget
equals SGLang's `compute_verify_token_budget` (tests/spec/test_planner.py checks it against the installed sglang).

`Planner` wraps plan_step with hysteresis (the verify<->decode mode switches only after `hysteresis_steps`
consecutive steps that want the switch) and is deterministic for identical inputs, which TP ranks rely on.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from k3_sglang.spec.cost import CostModel, step_seconds

MODES = ("static", "compact", "decode")


@dataclass(frozen=True)
class PlannerConfig:
    """min_verify_len: a floor of tokens per request (root included; capped by caps); survival_eps: cells below
    it are never verified by compact; margin: verify must model >= (1 + margin) x decode tokens/s;
    hysteresis_steps: consecutive steps wanting a verify<->decode switch before Planner makes it."""

    min_verify_len: int = 1
    survival_eps: float = 1e-6
    margin: float = 0.01
    hysteresis_steps: int = 2

    def __post_init__(self) -> None:
        if int(self.min_verify_len) != self.min_verify_len or self.min_verify_len < 1:
            raise ValueError(f"PlannerConfig.min_verify_len must be an int >= 1, got {self.min_verify_len}")
        if not (0.0 <= self.survival_eps < 1.0):
            raise ValueError(f"PlannerConfig.survival_eps must be in [0, 1), got {self.survival_eps}")
        if not (0.0 <= self.margin < 10.0):
            raise ValueError(f"PlannerConfig.margin must be in [0, 10), got {self.margin}")
        if int(self.hysteresis_steps) != self.hysteresis_steps or self.hysteresis_steps < 1:
            raise ValueError(f"PlannerConfig.hysteresis_steps must be an int >= 1, got {self.hysteresis_steps}")


@dataclass(frozen=True)
class Decision:
    """One step's plan. verify_lens [N]: tokens per request (root included, 1 <= len <= caps[i]; all 1 when
    mode == "decode"); budget: draft tokens verified = sum(verify_lens) - N; modelled_tps: expected committed
    tokens/s of this plan; decode_tps: N / cost.decode(N); verify_tps: modelled tokens/s of the best verify
    plan considered (the number the never-slower rule compared; 0.0 when there was none)."""

    mode: str
    verify_lens: tuple[int, ...]
    budget: int
    modelled_tps: float
    decode_tps: float
    verify_tps: float = 0.0


def survival_from_confidence(confidence: np.ndarray) -> np.ndarray:
    """survival [N, G] float64 = cumulative product of per-position conditional confidences [N, G] in [0, 1]."""
    conf = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    if conf.ndim != 2:
        raise ValueError(f"confidence must be [N, G], got shape {conf.shape}")
    return np.cumprod(conf, axis=1)


def _validate(survival: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(survival, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"survival must be a 2-D [N, G] array, got shape {s.shape}")
    n, g = s.shape
    if n < 1:
        raise ValueError("plan_step needs at least one request (survival has 0 rows)")
    c_raw = np.asarray(caps)
    if c_raw.shape != (n,):
        raise ValueError(f"caps must have shape [N]=({n},), got {c_raw.shape}")
    if c_raw.dtype.kind not in "iu":
        if c_raw.dtype.kind != "f" or not np.all(np.isfinite(c_raw)) or np.any(c_raw != np.round(c_raw)):
            raise ValueError(f"caps must be integers, got dtype {c_raw.dtype}")
    c = c_raw.astype(np.int64)
    if np.any(c < 1) or np.any(c > g + 1):
        raise ValueError(f"caps must lie in 1..G+1={g + 1}, got min {c.min()} max {c.max()}")
    if not np.all(np.isfinite(s)):
        raise ValueError("survival contains NaN or inf")
    if np.any(s < 0.0) or np.any(s > 1.0 + 1e-6):
        raise ValueError(f"survival must lie in [0, 1], got min {s.min()} max {s.max()}")
    if g > 1:
        rise = np.diff(s, axis=1)
        if np.any(rise > 1e-7):
            i, j = np.argwhere(rise > 1e-7)[0]
            raise ValueError(f"survival must be non-increasing along drafts: request {i} has survival[{i}, {j + 1}]"
                             f"={s[i, j + 1]} > survival[{i}, {j}]={s[i, j]}")
    return np.minimum(s, 1.0), c


def _decode_decision(n: int, decode_tps: float, verify_tps: float) -> Decision:
    return Decision("decode", (1,) * n, 0, decode_tps, decode_tps, verify_tps)


def _static(s: np.ndarray, caps: np.ndarray, cost: CostModel, decode_tps: float) -> Decision:
    n = s.shape[0]
    if np.all(caps == 1):
        return _decode_decision(n, decode_tps, 0.0)
    cols = np.arange(s.shape[1])[None, :]
    committed = n + float(np.sum(np.where(cols < caps[:, None] - 1, s, 0.0)))
    secs = float(step_seconds(cost, n, np.array([int(caps.sum())]), np.array([int(caps.max())]))[0])
    tps = committed / secs if secs > 0 else 0.0
    return Decision("verify", tuple(int(v) for v in caps), int(caps.sum()) - n, tps, decode_tps, tps)


@dataclass(frozen=True)
class _Plan:
    lens: np.ndarray  # [N] int64
    tps: float


def _best_compact(s: np.ndarray, caps: np.ndarray, cost: CostModel, cfg: PlannerConfig) -> _Plan:
    """The argmax-over-(L, k) verify plan, before the never-slower rule."""
    n, g = s.shape
    floor = np.minimum(int(cfg.min_verify_len), caps)  # [N] forced tokens (root + forced drafts)
    cols = np.arange(g)[None, :]
    forced = cols < (floor[:, None] - 1)
    eligible = (cols >= floor[:, None] - 1) & (cols < caps[:, None] - 1) & (s >= cfg.survival_eps)
    base_tokens = int(floor.sum())
    base_committed = n + float(np.sum(np.where(forced, s, 0.0)))
    base_l = int(floor.max())
    req, pos = np.nonzero(eligible)
    val = s[req, pos]
    order = np.lexsort((req, pos, -val))  # value desc, then position, then request (SGLang's tie order)
    req, pos, val = req[order], pos[order], val[order]
    best_tps, best_k, best_l, best_keep = -1.0, -1, -1, None
    for l_cap in range(max(base_l, int(caps.max())), base_l - 1, -1):  # larger L first: it wins exact ties
        keep = pos < l_cap - 1
        v = val[keep]
        committed = base_committed + np.concatenate(([0.0], np.cumsum(v)))
        chain = np.maximum(base_l, np.concatenate(([1], np.maximum.accumulate(pos[keep] + 2))))
        tokens = base_tokens + np.arange(v.size + 1)
        tps = committed / step_seconds(cost, n, tokens, chain)
        k = int(np.argmax(tps))  # first maximum: the smallest budget
        if tps[k] > best_tps or (tps[k] == best_tps and k < best_k):
            best_tps, best_k, best_l, best_keep = float(tps[k]), k, l_cap, keep
    chosen = req[best_keep][:best_k]
    lens = floor + np.bincount(chosen, minlength=n).astype(np.int64)
    return _Plan(lens, best_tps)


def plan_step(survival: np.ndarray, caps: np.ndarray, cost: CostModel, mode: str,
              config: PlannerConfig = PlannerConfig()) -> Decision:
    """One step's Decision for survival [N, G] float and caps [N] int in 1..G+1 (see the module docstring).

    Stateless (no hysteresis; see Planner). ValueError on bad shapes, values or mode.
    """
    if mode not in MODES:
        raise ValueError(f"planner mode must be one of {', '.join(MODES)}, got {mode!r}")
    s, c = _validate(survival, caps)
    n = s.shape[0]
    decode_tps = float(n / cost.decode(n))
    if mode == "decode":
        return _decode_decision(n, decode_tps, 0.0)
    if mode == "static":
        return _static(s, c, cost, decode_tps)
    plan = _best_compact(s, c, cost, config)
    return _compact_decision(plan, n, decode_tps, config)


def _wants_verify(plan: _Plan, n: int, decode_tps: float, cfg: PlannerConfig) -> bool:
    return int(plan.lens.sum()) > n and plan.tps >= decode_tps * (1.0 + cfg.margin)


def _verify_decision(plan: _Plan, n: int, decode_tps: float) -> Decision:
    lens = tuple(int(v) for v in plan.lens)
    return Decision("verify", lens, int(plan.lens.sum()) - n, plan.tps, decode_tps, plan.tps)


def _compact_decision(plan: _Plan, n: int, decode_tps: float, cfg: PlannerConfig) -> Decision:
    if _wants_verify(plan, n, decode_tps, cfg):
        return _verify_decision(plan, n, decode_tps)
    return _decode_decision(n, decode_tps, plan.tps)


class Planner:
    """Stateful plan_step with verify<->decode hysteresis: Planner(cost, mode, config).plan(survival, caps).

    The first step takes the mode plan_step wants. Afterwards the mode switches only once `hysteresis_steps`
    consecutive steps want the other mode; until then a held verify mode runs the best verify plan and a held
    decode mode decodes. A step whose best plan verifies no draft (nothing worth drafting: zero confidence, every
    cap 1) is a plain decode that leaves the state and the pending count alone, so a request finishing (cap 1)
    does not cost the next one `hysteresis_steps` of decoding. "static" and "decode" modes have no state.
    Deterministic for identical input sequences.
    """

    def __init__(self, cost: CostModel, mode: str = "compact", config: PlannerConfig = PlannerConfig()):
        if mode not in MODES:
            raise ValueError(f"planner mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.cost, self.mode, self.config = cost, mode, config
        self._state: str | None = None
        self._pending = 0

    @property
    def state(self) -> str | None:
        """The current compact mode ("verify" or "decode"), None before the first step."""
        return self._state

    def reset(self) -> None:
        self._state, self._pending = None, 0

    def plan(self, survival: np.ndarray, caps: np.ndarray) -> Decision:
        """Decision for survival [N, G] and caps [N] (see plan_step), with hysteresis in compact mode."""
        if self.mode != "compact":
            return plan_step(survival, caps, self.cost, self.mode, self.config)
        s, c = _validate(survival, caps)
        n = s.shape[0]
        decode_tps = float(n / self.cost.decode(n))
        plan = _best_compact(s, c, self.cost, self.config)
        want = "verify" if _wants_verify(plan, n, decode_tps, self.config) else "decode"
        if int(plan.lens.sum()) == n:  # nothing to verify: a plain decode that is no vote for either mode
            return _decode_decision(n, decode_tps, plan.tps)
        if self._state is None or want == self._state:
            self._state, self._pending = want, 0
        else:
            self._pending += 1
            if self._pending >= self.config.hysteresis_steps:
                self._state, self._pending = want, 0
        if self._state == "verify":
            return _verify_decision(plan, n, decode_tps)
        return _decode_decision(n, decode_tps, plan.tps)
