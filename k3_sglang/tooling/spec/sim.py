"""Simulator of no-spec vs verify-all vs confidence-scheduled verification on a modelled step cost (pure).

Each request emits `out_len` tokens. Its drafter has a constant conditional acceptance q drawn from a profile
(K3's published accept lengths at gamma=7: chat 2.7 tokens/step, math 5.0, and a 30/70 math/chat mixture),
its confidences are q (calibrated), so survival[j] = q^(j+1). At each output position the number of leading
drafts the target would accept is pre-sampled (common random numbers: every arm sees the same outcomes).
`n_slots` requests run at once (closed loop: a finished request is replaced by the next one). Per step:
- no-spec: a decode step, 1 token per request, cost.decode(N);
- verify-all: Planner "static" (verify every cap), cost.step(N, T, L);
- scheduled: Planner "compact" (budget argmax, allocation, decode fallback, hysteresis).
A verify of v tokens commits 1 + min(accepted, v - 1) tokens. Throughput = tokens / modelled seconds.

Cost shapes: `gpu_staircase()` (flat until a token knee, then proportional to the padded graph tier: the
roofline of a memory-bound MoE decode step, documented in docs/bench-verify-sim.md) and `cpu_affine()`
(13 ms + 0.87 ms/token, the 2-core tiny-K3 decode step of docs/bench-serve.md).

`python -m k3_sglang.tooling.spec.sim --out docs/bench-verify-sim.md` writes the table and a plot next to it.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from k3_sglang.spec.cost import AffineCost, CostModel, StaircaseCost
from k3_sglang.spec.planner import Planner, PlannerConfig

GAMMA = 7
ARMS = ("no-spec", "verify-all", "scheduled")
K3_ACCEPT_LENGTH = {"chat": 2.7, "math": 5.0}  # tokens per verify step at gamma=7 (K3's published figures)


def accept_length(q: float, gamma: int) -> float:
    """Expected tokens per verify-all step (accepted drafts + 1) for constant conditional acceptance q."""
    return 1.0 + sum(q ** j for j in range(1, gamma + 1))


def q_for_accept_length(target: float, gamma: int = GAMMA) -> float:
    """The constant q whose gamma-draft verify-all accept length is `target` (bisection; 1 <= target <= gamma+1)."""
    if not (1.0 <= target <= gamma + 1):
        raise ValueError(f"accept length must lie in [1, gamma+1={gamma + 1}], got {target}")
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if accept_length(mid, gamma) < target else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Profile:
    """A request mix: weights [C] (sum 1) over constant conditional acceptances qs [C]."""

    name: str
    weights: tuple[float, ...]
    qs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.qs) or not self.qs:
            raise ValueError(f"profile {self.name}: weights and qs must be non-empty and of equal length")
        if abs(sum(self.weights) - 1.0) > 1e-9 or min(self.weights) < 0:
            raise ValueError(f"profile {self.name}: weights must be >= 0 and sum to 1, got {self.weights}")
        if not all(0.0 <= q <= 1.0 for q in self.qs):
            raise ValueError(f"profile {self.name}: every q must lie in [0, 1], got {self.qs}")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """q [n] float64 for n requests."""
        return np.asarray(self.qs)[rng.choice(len(self.qs), size=n, p=np.asarray(self.weights))]


def k3_profiles(gamma: int = GAMMA) -> dict[str, Profile]:
    """chat (2.7 tokens/step), math (5.0) and mix (30 % math, 70 % chat) at `gamma` drafts."""
    q_chat = q_for_accept_length(K3_ACCEPT_LENGTH["chat"], gamma)
    q_math = q_for_accept_length(K3_ACCEPT_LENGTH["math"], gamma)
    return {"chat": Profile("chat", (1.0,), (q_chat,)), "math": Profile("math", (1.0,), (q_math,)),
            "mix": Profile("mix", (0.3, 0.7), (q_math, q_chat))}


def graph_tiers(max_tokens: int = 4096) -> tuple[int, ...]:
    """Token tiers a step is padded up to: 1..8, then every 8 to 256, every 32 to 1024, every 64 beyond."""
    tiers = list(range(1, 9)) + list(range(16, 257, 8)) + list(range(288, 1025, 32))
    tiers += list(range(1088, max_tokens + 1, 64))
    return tuple(t for t in tiers if t <= max_tokens)


def gpu_staircase(base_s: float = 0.025, knee_tokens: int = 1024, max_tokens: int = 4096) -> StaircaseCost:
    """Roofline staircase: base_s while the padded tier is <= knee_tokens (memory-bound), then
    base_s * tier / knee_tokens (compute-bound), constant within a tier."""
    tiers = graph_tiers(max_tokens)
    return StaircaseCost(tiers, tuple(base_s * max(1.0, t / knee_tokens) for t in tiers))


def cpu_affine() -> AffineCost:
    """13 ms + 0.87 ms per token for both verify and decode steps (docs/bench-serve.md, 2 cores, tiny K3)."""
    return AffineCost(c0=0.013, c_req=0.0, c_tok=0.00087, c_lmax=0.0, d0=0.013, d_req=0.00087)


@dataclass(frozen=True)
class ArmResult:
    """One arm's totals over the steady window (every slot busy; the drain at the end is left out, as a client
    measures while all its workers are active): committed tokens, modelled seconds, steps, decode steps,
    verified draft tokens; plus end-to-end tokens and seconds including the drain."""

    arm: str
    tokens: int
    seconds: float
    steps: int
    decode_steps: int
    draft_tokens: int
    e2e_tokens: int
    e2e_seconds: float

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds

    @property
    def e2e_tps(self) -> float:
        return self.e2e_tokens / self.e2e_seconds


def _accept_runs(rng: np.random.Generator, q: np.ndarray, out_len: int, gamma: int) -> np.ndarray:
    """accepted [R, out_len] int: leading drafts (of gamma) the target accepts at each output position."""
    ok = rng.random((q.size, out_len, gamma)) < q[:, None, None]
    runs = np.argmin(ok, axis=2)
    return np.where(ok.all(axis=2), gamma, runs)


def simulate_arm(arm: str, cost: CostModel, q: np.ndarray, accepted: np.ndarray, n_slots: int,
                 gamma: int = GAMMA, config: PlannerConfig = PlannerConfig()) -> ArmResult:
    """Run every request (q [R], accepted [R, out_len]) through `n_slots` concurrent slots under one arm."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")
    n_req, out_len = accepted.shape
    if q.shape != (n_req,) or n_req < n_slots:
        raise ValueError(f"need q [R] and accepted [R, out_len] with R >= n_slots={n_slots}, got q {q.shape} and "
                         f"accepted {accepted.shape}")
    planner = Planner(cost, "static" if arm == "verify-all" else "compact", config)
    powers = np.arange(1, gamma + 1)[None, :]
    slot_req = np.arange(min(n_slots, n_req))
    slot_pos = np.zeros(slot_req.size, dtype=np.int64)
    next_req, tokens, seconds, steps, decode_steps, drafts = slot_req.size, 0, 0.0, 0, 0, 0
    steady = None  # the totals when the batch first drops below n_slots
    while slot_req.size:
        n = slot_req.size
        if steady is None and n < n_slots:
            steady = (tokens, seconds, steps, decode_steps, drafts)
        remaining = out_len - slot_pos
        if arm == "no-spec":
            lens, mode = np.ones(n, dtype=np.int64), "decode"
        else:
            caps = np.minimum(gamma + 1, remaining)
            d = planner.plan(q[slot_req][:, None] ** powers, caps)
            lens, mode = np.asarray(d.verify_lens, dtype=np.int64), d.mode
        if mode == "decode":
            seconds += cost.decode(n)
            decode_steps += 1
        else:
            seconds += cost.step(n, int(lens.sum()), int(lens.max()))
        drafts += int(lens.sum()) - n
        commit = np.minimum(1 + np.minimum(accepted[slot_req, slot_pos], lens - 1), remaining)
        tokens += int(commit.sum())
        steps += 1
        slot_pos = slot_pos + commit
        done = slot_pos >= out_len
        for i in np.flatnonzero(done):
            if next_req < n_req:
                slot_req[i], slot_pos[i], done[i] = next_req, 0, False
                next_req += 1
        slot_req, slot_pos = slot_req[~done], slot_pos[~done]
    if steady is None:
        steady = (tokens, seconds, steps, decode_steps, drafts)
    return ArmResult(arm, *steady, e2e_tokens=tokens, e2e_seconds=seconds)


@dataclass(frozen=True)
class SimCase:
    """One (cost shape, profile, concurrency) point and its three arms."""

    cost_name: str
    profile: str
    n_slots: int
    results: tuple[ArmResult, ...]

    def tps(self, arm: str) -> float:
        return next(r for r in self.results if r.arm == arm).tps

    def result(self, arm: str) -> ArmResult:
        return next(r for r in self.results if r.arm == arm)


def run_case(cost_name: str, cost: CostModel, profile: Profile, n_slots: int, seed: int,
             waves: int = 4, min_requests: int = 32, out_len: int = 128, gamma: int = GAMMA) -> SimCase:
    """All three arms on the same requests: max(waves * n_slots, min_requests) requests of out_len tokens."""
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, got {n_slots}")
    rng = np.random.default_rng([seed, n_slots, sum(map(ord, profile.name))])
    n_req = max(waves * n_slots, min_requests)
    q = profile.draw(rng, n_req)
    accepted = _accept_runs(rng, q, out_len, gamma)
    results = tuple(simulate_arm(arm, cost, q, accepted, n_slots, gamma) for arm in ARMS)
    return SimCase(cost_name, profile.name, n_slots, results)


def run_grid(costs: dict[str, CostModel], profiles: dict[str, Profile], slots: tuple[int, ...], seed: int,
             **kw) -> list[SimCase]:
    """run_case over every cost shape x profile x concurrency."""
    return [run_case(cname, cost, prof, n, seed, **kw) for cname, cost in costs.items()
            for prof in profiles.values() for n in slots]


def default_costs() -> dict[str, CostModel]:
    return {"gpu-staircase": gpu_staircase(), "cpu-affine": cpu_affine()}


def ratio_row(case: SimCase) -> dict[str, float]:
    a, b, c = (case.tps(arm) for arm in ARMS)
    e2e = [case.result(arm).e2e_tps for arm in ARMS]
    return {"sched/no-spec": c / a, "sched/verify-all": c / b, "verify-all/no-spec": b / a,
            "sched/max": c / max(a, b), "e2e sched/max": e2e[2] / max(e2e[0], e2e[1])}


# ---- report (python -m k3_sglang.tooling.spec.sim) ----------------------------------------------------------------

SLOTS = (1, 4, 16, 64, 256)


def _machine() -> list[str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        load = "unknown"
    return [f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}",
            f"- Machine: {os.cpu_count()} CPUs (`nproc`), {model}; Python {platform.python_version()}, "
            f"numpy {np.__version__}; 1-min load {load} at start",
            "- The figures are modelled seconds from the cost shapes below, not wall-clock: they do not depend on "
            "the machine or its load (the seeded run is deterministic)."]


def _table(cases: list[SimCase], cost_name: str) -> list[str]:
    head = ("| profile | N | no-spec tok/s | verify-all tok/s | scheduled tok/s | sched/no-spec | sched/verify-all "
            "| sched/max(A,B) | decode steps | drafts/step |")
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cases:
        if c.cost_name != cost_name:
            continue
        r, s = ratio_row(c), c.result("scheduled")
        out.append(f"| {c.profile} | {c.n_slots} | {c.tps('no-spec'):.0f} | {c.tps('verify-all'):.0f} | "
                   f"{c.tps('scheduled'):.0f} | {r['sched/no-spec']:.3f} | {r['sched/verify-all']:.3f} | "
                   f"{r['sched/max']:.3f} | {100 * s.decode_steps / s.steps:.0f} % | {s.draft_tokens / s.steps:.1f} |")
    return out


def _checks(cases: list[SimCase]) -> list[str]:
    top = max(c.n_slots for c in cases)
    small = [c for c in cases if c.cost_name == "gpu-staircase" and c.n_slots <= 4]
    big_stair = [c for c in cases if c.cost_name == "gpu-staircase" and c.n_slots == top]
    big_cpu = [c for c in cases if c.cost_name == "cpu-affine" and c.n_slots == top]
    worst = min(cases, key=lambda c: ratio_row(c)["sched/max"])
    worst_e2e = min(cases, key=lambda c: ratio_row(c)["e2e sched/max"])
    fmt = lambda cs, key: ", ".join(f"{c.profile} {ratio_row(c)[key]:.2f}" for c in cs)  # noqa: E731
    fmt_n = lambda cs, key: ", ".join(f"{c.profile} N={c.n_slots} {ratio_row(c)[key]:.3f}" for c in cs)  # noqa: E731
    return [
        f"- Staircase, N={top}: scheduled/verify-all = {fmt(big_stair, 'sched/verify-all')} "
        "(anchor: SGLang measured +68 % at batch 256 on K3).",
        f"- Staircase, N<=4: scheduled/verify-all = {fmt_n(small, 'sched/verify-all')} (anchor: break-even or "
        "mildly negative below batch 8; the simulator has no planner or drafting overhead, so it shows break-even).",
        f"- CPU affine, N={top}: verify-all/no-spec = {fmt(big_cpu, 'verify-all/no-spec')}, scheduled/no-spec = "
        f"{fmt(big_cpu, 'sched/no-spec')}.",
        f"- Worst scheduled/max(no-spec, verify-all) over all {len(cases)} cases: {ratio_row(worst)['sched/max']:.4f} "
        f"({worst.cost_name}, {worst.profile}, N={worst.n_slots}); the goal is >= 0.99.",
        f"- End to end (the drain included, where the batch shrinks unevenly under speculation): worst scheduled/"
        f"max = {ratio_row(worst_e2e)['e2e sched/max']:.4f} ({worst_e2e.cost_name}, {worst_e2e.profile}, "
        f"N={worst_e2e.n_slots}).",
    ]


def _plot(cases: list[SimCase], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(c.cost_name for c in cases))
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.2), squeeze=False)
    colors = {"chat": "tab:blue", "math": "tab:orange", "mix": "tab:green"}
    for ax, name in zip(axes[0], names):
        for prof in dict.fromkeys(c.profile for c in cases):
            cs = [c for c in cases if c.cost_name == name and c.profile == prof]
            n = [c.n_slots for c in cs]
            ax.plot(n, [ratio_row(c)["sched/no-spec"] for c in cs], "-o", color=colors.get(prof),
                    label=f"{prof}: scheduled")
            ax.plot(n, [ratio_row(c)["verify-all/no-spec"] for c in cs], "--s", color=colors.get(prof),
                    alpha=0.6, label=f"{prof}: verify-all")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests N")
        ax.set_ylabel("tokens/s relative to no-spec")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", ncol=3)
    fig.suptitle("Simulated verify strategies (gamma=7, K3 accept lengths)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(cases: list[SimCase], profiles: dict[str, Profile], wall_s: float, seed: int, command: str,
           plot_name: str | None, sensitivity: list[SimCase], waves: int = 4, min_requests: int = 32) -> str:
    """The markdown document for `cases` (see main)."""
    prof_lines = [f"- {p.name}: " + ", ".join(f"{w:.0%} at q={q:.4f} (verify-all accept length "
                                               f"{accept_length(q, GAMMA):.2f})" for w, q in zip(p.weights, p.qs))
                  for p in profiles.values()]
    lines = ["# Simulated verify scheduling: no-spec vs verify-all vs confidence-scheduled", "",
             f"Command: `{command}` ({wall_s:.1f} s wall). Code: `k3_sglang/spec/sim.py`, planner "
             "`k3_sglang/spec/planner.py`.", "", *_machine(), "",
             "## Method", "",
             f"Closed loop: N concurrent requests, each emitting 128 tokens, max({waves}N, {min_requests}) requests "
             "per case (tokens/s over the steady window while all N slots are busy), seed "
             f"{seed}, gamma={GAMMA}. Each request has a constant conditional acceptance q; its confidences are q "
             "(calibrated), so survival[j] = q^(j+1); the accepted run at each output position is pre-sampled, so "
             "all three arms see the same outcomes. A verify of v tokens commits 1 + min(accepted, v-1) tokens. "
             "Arms: no-spec (decode steps), verify-all (Planner `static`), scheduled (Planner `compact`: budget "
             "argmax, top-k allocation, decode fallback with a 1 % margin, 2-step hysteresis). Profiles (q solved "
             "from K3's published accept lengths at gamma=7):", "", *prof_lines, "",
             "Cost shapes:", "",
             "- `gpu-staircase`: the roofline of a memory-bound MoE decode step, padded to graph tiers "
             "(1..8, every 8 to 256, every 32 to 1024, every 64 beyond): 25 ms while the padded tier is <= 1024 "
             "tokens (weight streaming dominates), then 25 ms x tier/1024 (compute-bound), flat within a tier. "
             "Decode = the same table at N tokens. The knee is a free parameter of the shape (not a measurement of "
             "K3); 1024 tokens puts verify-all at batch 256 (2048 tokens) at 2x a decode step. The sensitivity "
             "table below moves it.",
             "- `cpu-affine`: 13 ms + 0.87 ms per token for verify and decode alike (docs/bench-serve.md, 2 cores, "
             "tiny K3). No verify overhead is modelled, so a 1-token verify costs what a decode does.", ""]
    for name in dict.fromkeys(c.cost_name for c in cases):
        lines += [f"## {name}", "", *_table(cases, name), ""]
    lines += ["## Against the anchor and the goals", "", *_checks(cases), ""]
    if sensitivity:
        lines += ["## Sensitivity: staircase knee at the top concurrency", "",
                  "| knee tokens | profile | N | sched/no-spec | sched/verify-all | verify-all/no-spec |",
                  "|---:|---|---:|---:|---:|---:|"]
        for c in sensitivity:
            r = ratio_row(c)
            lines.append(f"| {c.cost_name.split('-')[-1]} | {c.profile} | {c.n_slots} | {r['sched/no-spec']:.3f} | "
                         f"{r['sched/verify-all']:.3f} | {r['verify-all/no-spec']:.3f} |")
        lines.append("")
    if plot_name:
        lines += [f"![tokens/s relative to no-spec]({plot_name})", ""]
    lines += ["Limits: modelled, not measured; constant per-request q and perfect calibration (the real drafters "
              "calibrate online); no drafting, planning or commit overhead; a request's caps are only limited "
              "by the tokens it may still emit. The measured CPU server run is `k3 bench verify`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: write the markdown report (and a PNG next to it) or print it with `--out -`."""
    ap = argparse.ArgumentParser(prog="python -m k3_sglang.tooling.spec.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="markdown path, or - to print")
    ap.add_argument("--plot", default=None, help="PNG path (default: --out with .png; none with --out -)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slots", default=",".join(map(str, SLOTS)), help="comma-separated concurrencies")
    ap.add_argument("--waves", type=int, default=4, help="requests per case = max(waves * N, --min-requests)")
    ap.add_argument("--min-requests", type=int, default=32)
    args = ap.parse_args(argv)
    try:
        slots = tuple(int(x) for x in args.slots.split(","))
        if not slots or min(slots) < 1 or max(slots) > 512 or args.waves < 1 or args.min_requests < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--slots must be comma-separated integers in 1..512, --waves and --min-requests >= 1; got "
                 f"--slots {args.slots!r}")
    plot = None if args.out == "-" and args.plot is None else Path(args.plot or Path(args.out).with_suffix(".png"))
    start = time.perf_counter()
    profiles = k3_profiles()
    kw = dict(waves=args.waves, min_requests=args.min_requests)
    cases = run_grid(default_costs(), profiles, slots, args.seed, **kw)
    top = max(slots)
    sensitivity = [run_case(f"gpu-staircase-knee-{k}", gpu_staircase(knee_tokens=k), profiles[p], top,
                            args.seed, **kw) for k in (512, 1024, 2048) for p in ("chat", "mix")]
    wall = time.perf_counter() - start
    command = "python -m k3_sglang.tooling.spec.sim " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(cases, profiles, wall, args.seed, command.strip(), plot.name if plot else None, sensitivity,
                  args.waves, args.min_requests)
    if plot:
        _plot(cases, plot)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
