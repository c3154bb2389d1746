"""Per-step decisions of K3_CSV: which requests may speculate, their drafts, and each one's verify length.

Who speculates: greedy requests (accepted by argmax, what SGLang's sampler picks) and sampled ones (temperature,
top-k, top-p, min-p: accepted by the speculative-sampling rule over SGLang's own sampling transforms,
spec/sampled_verify.py). A batch holding any request K3_CSV cannot verify is served by plain decode steps, never
refused: logprobs, grammars (structured output), penalties (frequency, presence, repetition, min-new-tokens), logit
bias, custom logit processors, watermarking, sampling-mask capture, SGLang's deterministic inference (its seeded,
batch-invariant sampler) and sampling backends other than pytorch and flashinfer (not mirrored). The others'
transforms run between the logits and the sampler or depend on the tokens already emitted, which a chain's later
rows do not have. A request's cap is min(chain width, 1 + drafted tokens, tokens it may still emit, context left).
The planner (spec/planner.py) turns the drafts' survival probabilities and the step-cost model into lengths;
`static` verifies every cap (verify-all), `decode` never verifies. Under TP every rank takes TP rank 0's lengths
and drafts.

Settled plain decoding: once `compact` has planned plain decode steps PROBE_AFTER times in a row, it drafts and
plans only on probe steps and decodes the steps between without asking the drafter or the planner (the drafter
catches up on the skipped tokens at the next probe). The probes are priced: each settled probe's host seconds
(drafter + planner, a moving average) against the cost model's plain decode step for the batch set the interval
(`probe_interval`): as many steps as keep the probes' mean cost per step within PROBE_BUDGET of a decode step,
at least PROBE_EVERY and at most PROBE_MAX_EVERY (so drafts that turn good are noticed within that many steps).
The first verify plan ends the streak.

Request sets: a server plans one running batch (group 0); a pipeline's first stage plans each microbatch, which
holds other requests, as its own group (spec/pp_hooks.py). Hysteresis, the plain-decoding streak and the departed
requests are tracked per group; the drafter and its calibration are shared.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from k3_sglang.spec.settings import SpecSettings

logger = logging.getLogger(__name__)

# CPU affine default when no K3_SPEC_COST_TABLE is given: the fit `k3 bench profile-verify` measured for the bf16
# tiny K3 on 2 cores (docs/verify-cost-cpu.json, 2026-12-03), rounded
DEFAULT_CPU_COST = dict(c0=0.0170, c_req=0.00044, c_tok=0.00032, c_lmax=0.00136, d0=0.0181, d_req=0.00019)
PROBE_AFTER = 8  # consecutive planned plain-decode steps before compact only probes
PROBE_EVERY = 4  # then it drafts and plans on one step in at least this many
PROBE_MAX_EVERY = 64  # and in at most this many
PROBE_BUDGET = 0.0025  # the settled probes' mean host time per step, as a share of a plain decode step
PROBE_SMOOTHING = 0.5  # weight of the newest probe in the moving average of its seconds


def probe_interval(probe_s: float, decode_s: float, budget: float = PROBE_BUDGET, lo: int = PROBE_EVERY,
                   hi: int = PROBE_MAX_EVERY) -> int:
    """Steps per probe so that a probe costing probe_s seconds, paid once per interval, adds at most `budget` x
    decode_s per step on average; clamped to [lo, hi] (hi also when the decode step's cost is unknown or zero)."""
    if not probe_s > 0:
        return lo
    if not decode_s > 0:
        return hi
    return max(lo, min(hi, math.ceil(probe_s / (budget * decode_s))))


def speculation_allowed(batch, sampled: bool = True) -> bool:
    """True when K3_CSV can verify every request of the batch as SGLang's sampler would draw its tokens: greedy ones
    by argmax over raw logits, sampled ones by rejection sampling when `sampled` (the server's sampling backend is
    one spec/sampled_verify.py mirrors; module docstring: what falls back)."""
    info = batch.sampling_info
    if batch.return_logprob or batch.has_grammar or info is None:
        return False
    orchestrator = info.penalizer_orchestrator
    if orchestrator is not None and orchestrator.is_required:
        return False
    if info.logit_bias is not None or info.has_custom_logit_processor or info.grammars is not None:
        return False
    if getattr(info, "has_watermark_candidates", False):
        return False
    if info.is_all_greedy:
        return True
    deterministic = getattr(info, "sampling_seed", None) is not None  # SGLang's deterministic inference
    return sampled and not deterministic and getattr(info, "sampling_mask_batch_indices", None) is None


def remaining_tokens(req) -> int:
    limit = req.sampling_params.max_new_tokens
    left = (limit - len(req.output_ids)) if limit is not None else 1 << 30
    return max(1, int(left))


@dataclass
class GroupState:
    """What the policy remembers of one request set (a server's running batch, or one pipeline microbatch): its
    requests, its compact planner's verify/decode hysteresis and its settled-plain-decoding streak."""
    running: set[str] = field(default_factory=set)
    planner: object | None = None
    plain_streak: int = 0  # consecutive compact steps planned as plain decode
    skipped: int = 0  # steps skipped since the last probe
    probe_s: float | None = None  # moving average of a settled probe's host seconds (drafter + planner)
    probe_every: int = PROBE_EVERY  # steps per probe once settled (probe_interval)
    ahead: bool | None = None  # this step's skip decision, taken before SGLang prepared it (plain_ahead)


class StepPolicy:
    """Drafter + planner for one worker (or a pipeline's first stage); deterministic for identical inputs. The
    drafter and its calibration are shared; hysteresis and probing are per request set (GroupState), so
    microbatches of other requests do not steer each other's mode."""

    def __init__(self, settings: SpecSettings, gamma: int, vocab_size: int, target=None):
        self.settings, self.gamma, self.vocab_size = settings, gamma, vocab_size
        self.target = target  # the checkpoint drafter's TargetHeads (spec/drafters/checkpoint.py)
        self._drafter = None
        self._cost = None
        self._groups: dict[int, GroupState] = {}
        self._sampling_backend: str | None = None
        self.clock = time.perf_counter  # times the probes (tests inject their own)

    @property
    def sampling_backend(self) -> str | None:
        """The server's sampling backend (read once SGLang has published its runtime context; None before)."""
        if self._sampling_backend is None:
            from k3_sglang.spec.sampled_verify import current_sampling_backend

            self._sampling_backend = current_sampling_backend()
        return self._sampling_backend

    @property
    def sampled_ok(self) -> bool:
        """Sampled requests may speculate: spec/sampled_verify.py mirrors the server's sampling backend."""
        from k3_sglang.spec.sampled_verify import backend_supported

        return backend_supported(self.sampling_backend)

    @property
    def drafter(self):
        if self._drafter is None:
            from k3_sglang.spec.drafters import build_drafter

            s = self.settings
            self._drafter = build_drafter(s.drafter, oracle_path=s.oracle, profile=s.profile, seed=s.seed,
                                          vocab_size=self.vocab_size, lookup_window=s.lookup_window,
                                          prior_path=s.prior, draft_path=s.draft_path, target=self.target)
        return self._drafter

    def group(self, group: int = 0) -> GroupState:
        return self._groups.setdefault(group, GroupState())

    def planner(self, group: int = 0):
        """The group's Planner (its own hysteresis) on the shared cost model."""
        state = self.group(group)
        if state.planner is None:
            from k3_sglang.spec.cost import AffineCost, load_cost
            from k3_sglang.spec.planner import Planner

            if self._cost is None:
                s = self.settings
                self._cost = load_cost(s.cost_table) if s.cost_table else AffineCost(**DEFAULT_CPU_COST)
            state.planner = Planner(self._cost, self.settings.verify_mode)
        return state.planner

    def release(self, rid: str) -> None:
        if self._drafter is not None:
            self._drafter.release(rid)

    def reset(self) -> None:
        self._drafter = None
        self._groups.clear()

    def plain_ahead(self, batch, group: int = 0) -> bool:
        """Before SGLang prepares the batch's next decode step: True when that step will be plain decode without
        planning (the `decode` mode, a batch holding a request K3_CSV cannot verify, or a settled compact policy
        between probes), so that it may take SGLang's non-speculative path (spec/plain_path.py). The skip decision
        taken here is the one the step's `plan` uses."""
        s = self.settings
        if s.force_verify_len is not None:
            return False
        if s.verify_mode == "decode" or not speculation_allowed(batch, self.sampled_ok):
            return True
        state = self.group(group)
        state.ahead = None
        state.ahead = self._skip_planning(group)
        return state.ahead

    def _skip_planning(self, group: int = 0) -> bool:
        """True on the steps a settled plain-decoding compact policy does not probe (module docstring); a decision
        already taken for this step by `plain_ahead` is used once."""
        state = self.group(group)
        if state.ahead is not None:
            ahead, state.ahead = state.ahead, None
            return ahead
        if self.settings.verify_mode != "compact" or state.plain_streak < PROBE_AFTER:
            return False
        state.skipped += 1
        if state.skipped < state.probe_every:
            return True
        state.skipped = 0
        return False

    def plan(self, batch, width: int, context_len: int, tp_group, group: int = 0) -> tuple[list[int], list[list[int]]]:
        """(verify_lens [B] >= 1, drafts [B] lists of at least verify_len - 1 tokens) for this decode step.

        `group` names the batch's request set: one server has one running batch (group 0), a pipeline's first stage
        one per microbatch, each holding other requests (only those that leave their own group are forgotten)."""
        lens, drafts = self._plan_local(batch, width, context_len, group)
        if tp_group is not None and tp_group.world_size > 1:
            lens, drafts = tp_group.broadcast_object((lens, drafts), src=0)
        return lens, drafts

    def _forget_departed(self, reqs, group: int = 0) -> None:
        """Drop drafter state of requests that left their decode batch (finished, aborted or retracted: a retracted
        request that comes back is indexed again from its context)."""
        current = {r.rid for r in reqs}
        state = self.group(group)
        for rid in state.running - current:
            self.release(rid)
        state.running = current

    def _plan_local(self, batch, width: int, context_len: int, group: int = 0) -> tuple[list[int], list[list[int]]]:
        reqs = batch.reqs
        bs = len(reqs)
        s = self.settings
        self._forget_departed(reqs, group)
        if bs == 0 or s.verify_mode == "decode" or not speculation_allowed(batch, self.sampled_ok):
            return [1] * bs, [[] for _ in range(bs)]
        if s.force_verify_len is None and self._skip_planning(group):
            return [1] * bs, [[] for _ in range(bs)]
        seq = batch.seq_lens_cpu.tolist()
        hard = [max(1, min(width, remaining_tokens(r), context_len - int(n))) for r, n in zip(reqs, seq)]
        if s.force_verify_len is not None:  # profiling: exactly this length, drafts = the root repeated
            lens = [min(s.force_verify_len, h) for h in hard]
            return lens, [[int(r.output_ids[-1])] * (n - 1) for r, n in zip(reqs, lens)]
        from k3_sglang.spec.drafters.base import DraftRequest

        t0 = self.clock()
        block = self.drafter.propose([DraftRequest(r.rid, r.origin_input_ids, r.output_ids) for r in reqs],
                                     self.gamma)
        caps = np.minimum(np.asarray(hard, dtype=np.int64), 1 + np.asarray(block.n_drafted, dtype=np.int64))
        survival = np.array(block.survival(), dtype=np.float64)
        cols = np.arange(survival.shape[1])[None, :]
        survival = np.where(cols < (caps[:, None] - 1), survival, 0.0)
        decision = self.planner(group).plan(survival, caps)
        lens = [int(n) for n in decision.verify_lens] if decision.mode == "verify" else [1] * bs
        state = self.group(group)
        if state.plain_streak >= PROBE_AFTER:  # a settled probe: price it
            self._price_probe(state, self.clock() - t0, bs, group)
        state.plain_streak = 0 if max(lens) > 1 else state.plain_streak + 1
        if state.plain_streak == 0:
            state.probe_s, state.probe_every = None, PROBE_EVERY
        drafts = [[int(t) for t in block.tokens[i, : n - 1]] for i, n in enumerate(lens)]
        return lens, drafts

    def _price_probe(self, state: GroupState, seconds: float, n_reqs: int, group: int = 0) -> None:
        """Fold one settled probe's host seconds into the group's average and set its probe interval from the cost
        model's plain decode step of n_reqs requests."""
        seconds = max(0.0, seconds)
        state.probe_s = seconds if state.probe_s is None else (
            PROBE_SMOOTHING * seconds + (1 - PROBE_SMOOTHING) * state.probe_s)
        state.probe_every = probe_interval(state.probe_s, float(self.planner(group).cost.decode(n_reqs)))

    def observe(self, reqs, lens: list[int], commit_lens: list[int]) -> None:
        if self._drafter is None:
            return
        for req, n, c in zip(reqs, lens, commit_lens):
            if n > 1:
                try:
                    self._drafter.observe(req.rid, n - 1, c - 1)
                except ValueError as e:  # a calibration update is never worth a failed step
                    logger.warning("K3_CSV: drafter observation for %s dropped: %s", req.rid, e)
