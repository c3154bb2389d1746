"""Summary math and docs/bench-verify.md of `k3 bench verify` (pure except write_report / plot).

A cell is one (workload, concurrency, arm, round): the streamed requests it served. Rates:
- decode tokens/s = c x sum(tokens - 1) / sum(seconds after the first token): c streams each decoding at the
  pooled per-stream rate (the tokens after the first over the time after the first, aggregated over requests);
- end-to-end output tokens/s = all completion tokens / the cell's wall time.
Medians over rounds. Goals of issue 11 (per workload): C >= max(A, B) - 1% at every concurrency, and C >= 1.68 x B
at the top concurrency where B (verify-all) is slower than A (no-spec).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

ARMS = ("A", "B", "C")
ARM_NAMES = {"A": "A no-spec", "B": "B verify-all (static)", "C": "C confidence-scheduled (compact)"}
GOAL_TOLERANCE = 0.01
GOAL_TOP_RATIO = 1.68


@dataclass(frozen=True)
class RequestResult:
    """One streamed greedy request: seconds to the first chunk, seconds first -> last chunk, output token ids."""

    key: str  # the prompt's identity (same prompt across arms)
    ttft_s: float
    decode_s: float
    output_ids: tuple[int, ...]
    accept_length: float | None = None  # meta_info spec_accept_length, when the server reports it

    @property
    def tokens(self) -> int:
        return len(self.output_ids)


@dataclass(frozen=True)
class StepTotals:
    """Sums over the K3_SPEC_RECORD lines of one cell (zeros for the no-spec arm)."""

    verify_steps: int = 0
    decode_steps: int = 0
    verify_reqs: int = 0  # sum of n_reqs over verify steps
    decode_reqs: int = 0
    accepted: int = 0  # drafts accepted over verify steps

    @classmethod
    def of(cls, records: list[dict]) -> "StepTotals":
        ver = [r for r in records if r["kind"] == "verify"]
        dec = [r for r in records if r["kind"] == "decode"]
        return cls(len(ver), len(dec), sum(r["n_reqs"] for r in ver), sum(r["n_reqs"] for r in dec),
                   sum(r["accepted"] for r in ver))

    def __add__(self, other: "StepTotals") -> "StepTotals":
        return StepTotals(*(a + b for a, b in zip(
            (self.verify_steps, self.decode_steps, self.verify_reqs, self.decode_reqs, self.accepted),
            (other.verify_steps, other.decode_steps, other.verify_reqs, other.decode_reqs, other.accepted))))

    @property
    def decode_fraction(self) -> float | None:
        total = self.verify_steps + self.decode_steps
        return self.decode_steps / total if total else None

    @property
    def accept_length(self) -> float | None:
        """Tokens committed per request per verify step (1 + accepted drafts)."""
        return (self.verify_reqs + self.accepted) / self.verify_reqs if self.verify_reqs else None

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens committed per request per decode round, plain-decode rounds included."""
        reqs = self.verify_reqs + self.decode_reqs
        return (reqs + self.accepted) / reqs if reqs else None


@dataclass(frozen=True)
class CellRun:
    concurrency: int
    wall_s: float
    requests: tuple[RequestResult, ...]
    steps: StepTotals = field(default_factory=StepTotals)

    @property
    def decode_tps(self) -> float:
        return decode_rate(self.requests, self.concurrency)

    @property
    def e2e_tps(self) -> float:
        return sum(r.tokens for r in self.requests) / self.wall_s


def decode_rate(requests, concurrency: int) -> float:
    """c x sum(tokens - 1) / sum(decode seconds): the aggregate decode tokens/s of c concurrent streams."""
    toks = sum(r.tokens - 1 for r in requests)
    secs = sum(r.decode_s for r in requests)
    if toks <= 0 or secs <= 0:
        raise ValueError(f"no decode interval to rate: {toks} tokens after the first in {secs} s")
    return concurrency * toks / secs


@dataclass(frozen=True)
class CellSummary:
    decode_tps: float  # median over rounds
    e2e_tps: float
    tokens_per_round: float | None  # per request per decode round, plain rounds included (meta_info, else records)
    verify_accept: float | None  # tokens committed per request per verify step (step records)
    decode_fraction: float | None  # decode rounds run as plain decode (step records)
    rounds: int
    decode_per_round: tuple[float, ...] = ()  # the cell's rate in each round, in round order (the spread)
    e2e_per_round: tuple[float, ...] = ()


def summarize_cell(runs: list[CellRun]) -> CellSummary:
    steps = StepTotals()
    for r in runs:
        steps = steps + r.steps
    meta = [q.accept_length for r in runs for q in r.requests if q.accept_length is not None]
    per_round = statistics.mean(meta) if meta else steps.tokens_per_step
    return CellSummary(statistics.median(r.decode_tps for r in runs), statistics.median(r.e2e_tps for r in runs),
                       per_round, steps.accept_length, steps.decode_fraction, len(runs),
                       tuple(r.decode_tps for r in runs), tuple(r.e2e_tps for r in runs))


def round_ratios(cells, workload: str, c: int, metric: str = "decode_tps") -> list[float]:
    """C / max(A, B) in each round of one cell (the arms of a round ran next to each other); [] without per-round
    rates."""
    field_name = "decode_per_round" if metric == "decode_tps" else "e2e_per_round"
    a, b, cc = (getattr(cells[(workload, c, arm)], field_name) for arm in ARMS)
    return [z / max(x, y) for x, y, z in zip(a, b, cc)]


def spread_text(ratios: list[float]) -> str:
    """'0.95-1.02 over 2 rounds' (min to max of the per-round ratios), or '-' without them."""
    return f"{min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds" if ratios else "-"



def identity(outputs: dict[str, dict[str, tuple[int, ...]]]) -> tuple[int, int, list[str]]:
    """outputs[prompt key][arm or 'oracle'] -> ids: (prompts identical across all entries, prompts, mismatched keys).
    A prompt some arm never served counts as a mismatch (nothing is hidden)."""
    same, bad = 0, []
    for key, by_arm in sorted(outputs.items()):
        seqs = list(by_arm.values())
        if all(a in by_arm for a in ARMS) and all(s == seqs[0] for s in seqs):
            same += 1
        else:
            bad.append(key)
    return same, len(outputs), bad


def agreement_with_a(outputs: dict[str, dict[str, tuple[int, ...]]]) -> dict[str, tuple[int, int]]:
    """For each other entry (B, C, oracle): (prompts whose output equals A's, prompts both served)."""
    out = {}
    for other in ("B", "C", "oracle"):
        pairs = [(v["A"], v[other]) for v in outputs.values() if "A" in v and other in v]
        if pairs:
            out[other] = (sum(a == b for a, b in pairs), len(pairs))
    return out


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def goals(cells: dict[tuple[str, int, str], CellSummary], workload: str, concurrency: list[int],
          metric: str = "decode_tps") -> dict:
    """Issue 11's two goals on `metric` for one workload: per-concurrency pass flags and the top-B-loses check."""
    per_c = {}
    noise = {}  # c -> True where the cell misses on its medians but some round of it met the bar
    loses = []
    for c in concurrency:
        a, b, cc = (getattr(cells[(workload, c, arm)], metric) for arm in ARMS)
        per_c[c] = cc >= (1 - GOAL_TOLERANCE) * max(a, b)
        ratios = round_ratios(cells, workload, c, metric)
        noise[c] = not per_c[c] and bool(ratios) and max(ratios) >= 1 - GOAL_TOLERANCE
        if b < a:
            loses.append(c)
    top = max(loses) if loses else None
    top_ratio = None
    if top is not None:
        top_ratio = getattr(cells[(workload, top, "C")], metric) / getattr(cells[(workload, top, "B")], metric)
    return {"every_c": per_c, "within_noise": noise, "goal1": all(per_c.values()), "top_loses": top,
            "top_ratio": top_ratio,
            "goal2": None if top is None else top_ratio >= GOAL_TOP_RATIO}


def workload_table(cells, workload: str, concurrency: list[int]) -> str:
    lines = ["| c | A decode tok/s | B decode tok/s | C decode tok/s | C/A | C/B | C/max(A,B) | "
             "A e2e tok/s | B e2e tok/s | C e2e tok/s | C/max(A,B) e2e | B tok/round | C tok/round | "
             "B accept/verify | C accept/verify | C plain-decode rounds | C/max(A,B) per round (min-max) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in concurrency:
        a, b, cc = (cells[(workload, c, arm)] for arm in ARMS)
        lines.append(
            f"| {c} | {a.decode_tps:.1f} | {b.decode_tps:.1f} | {cc.decode_tps:.1f} | "
            f"{cc.decode_tps / a.decode_tps:.3f} | "
            f"{cc.decode_tps / b.decode_tps:.3f} | {cc.decode_tps / max(a.decode_tps, b.decode_tps):.3f} | "
            f"{a.e2e_tps:.1f} | {b.e2e_tps:.1f} | {cc.e2e_tps:.1f} | {cc.e2e_tps / max(a.e2e_tps, b.e2e_tps):.3f} | "
            f"{_fmt(b.tokens_per_round)} | {_fmt(cc.tokens_per_round)} | {_fmt(b.verify_accept)} | "
            f"{_fmt(cc.verify_accept)} | "
            f"{'-' if cc.decode_fraction is None else f'{cc.decode_fraction * 100:.0f}%'} | "
            f"{spread_text(round_ratios(cells, workload, c))} |")
    return "\n".join(lines)


def goal_lines(cells, workload: str, concurrency: list[int]) -> list[str]:
    out = []
    for metric, label in (("decode_tps", "decode tok/s"), ("e2e_tps", "end-to-end tok/s")):
        g = goals(cells, workload, concurrency, metric)
        fails = [c for c, ok in g["every_c"].items() if not ok]
        noisy = [c for c in fails if g["within_noise"][c]]
        why = "; ".join(f"c = {c}: C/max(A,B) per round {spread_text(round_ratios(cells, workload, c, metric))}"
                        + (", a round met the bar: a miss within the noise" if c in noisy else ", no round met it")
                        for c in fails)
        out.append(f"- {label}, C >= max(A, B) - 1% at every concurrency: "
                   + ("**met**" if g["goal1"] else f"**NOT met** (fails at c = {', '.join(map(str, fails))}; {why})"))
        if g["top_loses"] is None:
            out.append(f"- {label}, C >= 1.68 x B where B loses: not applicable (B is not slower than A at any "
                       "concurrency measured)")
        else:
            out.append(f"- {label}, C >= 1.68 x B at c = {g['top_loses']} (top concurrency where B < A): C/B = "
                       f"{g['top_ratio']:.3f}, " + ("**met**" if g["goal2"] else "**NOT met**"))
    return out


def plot(cells, workloads: list[str], concurrency: list[int], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for arm, style in zip(ARMS, ("o-", "s--", "^-")):
            ax.plot(concurrency, [cells[(w, c, arm)].decode_tps for c in concurrency], style, label=ARM_NAMES[arm])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(concurrency, [str(c) for c in concurrency])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(w)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("k3 bench verify: tiny K3 on CPU, decode tokens/s (medians)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def identity_lines(outputs, workloads: list[str], mismatches=None, dtype: str = "bfloat16") -> list[str]:
    """Per workload: prompts identical across arms and, for the mismatches, the near-tie classification of their
    first differing token (tooling/bench/output_identity.py; None: not classified)."""
    from k3_sglang.tooling.bench.output_identity import summary_lines

    lines = []
    for w in workloads:
        sub = {k: v for k, v in outputs.items() if k.startswith(w + "/")}
        same, total, bad = identity(sub)
        what = "A, B, C and the oracle pass on A" if w == "controlled" else "A, B and C"
        pairs = "; ".join(f"{'oracle pass' if k == 'oracle' else k} = A on {n} / {t}"
                          for k, (n, t) in agreement_with_a(sub).items())
        if same == total:
            lines.append(f"- {w}: {same} / {total} prompts token-identical across {what}")
        else:
            lines.append(f"- **{w}: OUTPUT MISMATCH: only {same} / {total} prompts token-identical across {what}** "
                         f"({pairs}); first mismatched: {', '.join(bad[:5])}")
            if mismatches is not None:
                lines += ["  " + x for x in summary_lines([m for m in mismatches if m.key.startswith(w + "/")],
                                                          dtype)]
    return lines


IDENTITY_HOW = {
    False: "bf16: every arm's output is compared with A's on the same prompt. A mismatch is excused only as a near "
           "tie: at its first differing token (context = prompt + the tokens both agree on) A's server is asked for "
           "that position's log-probability row (one prefill, return_logprob, top_logprobs_num = vocabulary), and the "
           "two tokens must be the row's top two with a gap <= |logit| x 2^-8 (bf16's rounding of that row; |logit| "
           "measured from the row's mean). Any other mismatch fails the run (exit 1).",
    True: "float32: token identity across arms is the check; any mismatch fails the run (exit 1)."}


def write_report(args, started, load_before, cells, outputs, concurrency, per_worker, work,
                 mismatches=None) -> str:
    """The markdown of the run (printed; written to args.out with the plot beside it unless args.out is '-')."""
    import os
    from pathlib import Path

    from k3_sglang.tooling.bench.profile_verify import machine

    load = os.getloadavg()
    workloads = [w for w in args.workloads if all((w, c, "A") in cells for c in concurrency)]
    cmd = (f"k3 bench verify --concurrency {' '.join(map(str, concurrency))} --repeats {args.repeats} "
           f"--max-new-tokens {args.max_new_tokens} --prompt-tokens {args.prompt_tokens} --min-requests "
           f"{args.min_requests} --workloads {' '.join(args.workloads)} --width {args.width} --profile {args.profile} "
           f"--cost-table {args.cost_table}" + (f" --dtype {args.dtype}" if args.dtype else "")
           + (f" --pp-size {args.pp_size}" if getattr(args, "pp_size", 1) > 1 else ""))
    model = ("SGLang's own K3 (sglang.srt.models.kimi_k3 on the k3_cpu platform)"
             if getattr(args, "model_impl", "sglang") == "sglang" else "the portable K3 model")
    png = Path(str(args.out)).with_suffix(".png") if str(args.out) != "-" else None
    parts = [
        "# `k3 bench verify`: no-spec vs verify-all vs confidence-scheduled verification (K3_CSV)", "",
        f"Run {started:%Y-%m-%d %H:%M} UTC on {machine()}; load average {load_before[0]:.2f} before, "
        f"{load[0]:.2f} at the end. Command:", "", f"```\n{cmd}\n```", "",
        f"Servers: the tiny K3 (random weights), served by {model}, in {args.dtype or 'bf16'} with `k3 serve` "
        "defaults, "
        "`--disable-radix-cache "
        "--max-running-requests 64`" + (f" and `--pp-size {args.pp_size}` (every arm a pipeline)"
                                        if getattr(args, "pp_size", 1) > 1 else "") + ", SGLang 0.5.23 on CPU. "
        f"A = no speculation; B = `--speculative-algorithm K3_CSV --speculative-num-draft-tokens {args.width}` with "
        f"K3_SPEC_VERIFY_MODE=static (verify every draft); C = the same with K3_SPEC_VERIFY_MODE=compact and "
        f"K3_SPEC_COST_TABLE={args.cost_table} (the planner). Workloads: `controlled` = the controlled drafter "
        f"(K3_SPEC_PROFILE={args.profile}) replaying A's greedy outputs from an oracle pass; `agent` = the lookup "
        "drafter on prompts that re-quote two code/tool-output spans; `chat` = the lookup drafter on random prompts.",
        "",
        "Each cell: c closed-loop workers, each streaming "
        f"{{{', '.join(f'c={c}: {per_worker[c]}' for c in concurrency)}}}"
        f" greedy requests back to back ({args.prompt_tokens}-token prompts by input_ids, ignore_eos, "
        f"{args.max_new_tokens} new tokens); the same prompts for every arm, fresh prompts every round; arms "
        f"interleaved per round (A,B,C then C,B,A), {args.repeats} rounds, medians. Decode tok/s = c x (tokens after "
        "the first) / (stream time after the first token), pooled over the cell's requests; e2e tok/s = completion "
        "tokens / cell wall time. tok/round = completion tokens per request per decode round, plain rounds included "
        "(SGLang's meta_info spec_accept_length, else the K3_SPEC_RECORD step records); accept/verify = tokens "
        "committed per request per verify step (step records); C plain-decode rounds = the share of C's decode "
        "rounds that the planner ran as plain decode (step records); C/max(A,B) per round = that ratio in each "
        "round (the arms of a round ran next to each other), its min-max the cell's spread: a goal line names each "
        "missed cell's spread and says *a miss within the noise* when some round of it met the bar.", "",
        "## Output identity (greedy, token ids)", "", IDENTITY_HOW[(args.dtype or "bfloat16") == "float32"], "",
        *identity_lines(outputs, args.workloads, mismatches, args.dtype or "bfloat16"), ""]
    for w in workloads:
        parts += [f"## {w}", "", workload_table(cells, w, concurrency), "", "Goals:", "",
                  *goal_lines(cells, w, concurrency), ""]
    if png is not None and workloads:
        parts += [f"![tokens/s vs concurrency]({png.name})", ""]
    text = "\n".join(parts)
    if png is not None:
        out = Path(str(args.out))
        out.parent.mkdir(parents=True, exist_ok=True)
        if workloads:
            plot(cells, workloads, concurrency, png)
        out.write_text(text)
        print(f"wrote {out}" + (f" and {png}" if workloads else "") + f" (server logs and records in {work})")
    return text
