"""`k3 bench sessions`: multi-turn agent sessions against `k3 serve` whose device KV pool holds a fraction of the live
sessions' tokens, with SGLang's HiCache off, with a host tier, and with host + Mooncake store, side by side.

The same traffic (bench/session_traffic.py: N sessions, each opening with --first-tokens, then per turn the answer
and --tool-tokens of tool output appended, round-robin, --think-s between requests, greedy) is served by one fresh
server per arm, in one run:

- `off`: device pool = live tokens / --oversubscription, HiCache off (a resumed turn recomputes what LRU evicted);
- `host`: the same device pool + a host tier holding every session (`--hicache-ratio` sized from the traffic);
- `host-l3`: the same device pool + a host tier holding about half of them + Mooncake store (L3) for the rest, its
  master started here on loopback;
- `resident`: a device pool holding every session, HiCache off (the ceiling);
- `restart`: the host-l3 arm's pools with the file store (L3) instead of Mooncake and SGLang's `wait_complete`
  prefetch policy; the worker is stopped after the second-to-last turn and a new process started on the same storage
  directory, so the last turn resumes from what survives a restart (its resumed-turn figures count the last turn
  only). Under SGLang's default `timeout` policy the deadline is 1 s + 0.25 s per 1K tokens, and a KDA model's
  prefetch that misses it is discarded whole (its KDA state is stored at the end of the history only): measured at
  64K tokens, the file store read 21,632 to 30,080 of 65,543 pages by the 17 s deadline and every turn was recomputed.

Per arm: resumed-turn TTFT p50/p99, prompt tokens prefilled per resumed turn, cache hits by tier, and whether every
answer equals the `off` arm's (bench/sessions_summary.py); the ratios off/host and host/resident against the issue's
goals; docs/bench-sessions.md and a plot (bench/sessions_report.py).
"""

from __future__ import annotations

import argparse
import datetime
import math
import tempfile
import time
from pathlib import Path

from k3_sglang.tooling.bench.session_traffic import SessionTraffic, TurnRecord, run_sessions

DOC = Path("docs/bench-sessions.md")
ARMS = ("off", "host", "host-l3", "resident", "restart")
POOL_GRANULE = 256
PROMPT_HEADROOM = 64  # tokens above a session's last prompt the smallest pool keeps
HOST_HEADROOM = 1.25  # the host arm's tier holds every session with this much room
L3_HOST_SHARE = 0.5  # the host-l3 arm's host tier holds about this share of the sessions
L3_SEGMENT_BYTES = 1 << 30  # Mooncake segment of the host-l3 arm (k3-tiny: ~1 KB of latent per token, fp32)
# (slow arm, fast arm, goal on slow/fast resumed-turn TTFT p50: (">=" or "<=", x) or None), issue 42's goals
GOALS = (("off", "host", (">=", 10.0)), ("host", "resident", ("<=", 1.5)), ("host-l3", "resident", ("<=", 2.5)),
         ("restart", "resident", None), ("off", "restart", None))
# before the restart arm stops its worker, SGLang's write-through queue drains to storage: this long, plus 1 s per
# 8,192 tokens of a session (no public signal says the queue is empty)
DRAIN_S = 3.0
DRAIN_TOKENS_PER_S = 8192


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=8, help="live agent sessions (default 8)")
    parser.add_argument("--first-tokens", type=int, default=16000, help="tokens each session opens with")
    parser.add_argument("--tool-tokens", type=int, default=256, help="tool output appended per turn")
    parser.add_argument("--output-tokens", type=int, default=16, help="answer tokens per turn (greedy)")
    parser.add_argument("--turns", type=int, default=3, help="turns per session (the first is not a resumed turn)")
    parser.add_argument("--think-s", type=float, default=0.5, help="pause after each request (tool time)")
    parser.add_argument("--oversubscription", type=float, default=4.0,
                        help="live session tokens / device KV pool of the off, host and host-l3 arms (default 4)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="arms to run (default all)")
    parser.add_argument("--startup-s", type=float, default=900.0,
                        help="how long each arm's server may take to turn healthy (default 900; shared machines)")
    parser.add_argument("--out", type=Path, default=DOC, help="report (default docs/bench-sessions.md; '-': none)")
    parser.add_argument("serve_args", nargs="*", help="extra `k3 serve` args, after --")


def _round_up(n: float, granule: int = POOL_GRANULE) -> int:
    return int(math.ceil(n / granule) * granule)


def arm_flags(arm: str, traffic: SessionTraffic, oversubscription: float) -> list[str]:
    """The `k3 serve` flags that make an arm (besides the Mooncake environment of host-l3)."""
    live = traffic.sessions * traffic.session_tokens()
    if arm == "resident":
        return ["--max-total-tokens", str(_round_up(live * HOST_HEADROOM))]
    # a session's last prompt must fit the pool (SGLang aborts a longer one): few sessions can't oversubscribe more
    device = _round_up(max(live / oversubscription, traffic.session_tokens() + PROMPT_HEADROOM))
    flags = ["--max-total-tokens", str(device)]
    if arm == "host":
        flags += ["--enable-hierarchical-cache", "--hicache-ratio", f"{math.ceil(live * HOST_HEADROOM / device)}"]
    elif arm in ("host-l3", "restart"):
        flags += ["--enable-hierarchical-cache", "--hicache-ratio", f"{max(1.0, live * L3_HOST_SHARE / device):.2f}",
                  "--hicache-storage-backend", "mooncake" if arm == "host-l3" else "file"]
    elif arm != "off":
        raise ValueError(f"unknown arm {arm!r}")
    if arm == "restart":  # a KDA model keeps no partial prefetch: SGLang's deadline (1 s + 0.25 s per 1K tokens) would
        flags += ["--hicache-storage-prefetch-policy", "wait_complete"]  # discard a 64K read from files, then recompute
    return flags


def resumed_from(arm: str, traffic: SessionTraffic) -> int:
    """The first turn an arm's resumed-turn figures count: the last one for `restart` (after the restart), else 1."""
    return traffic.turns - 1 if arm == "restart" else 1


def run_arm(arm: str, traffic: SessionTraffic, args: argparse.Namespace, workdir: Path) -> list[TurnRecord]:
    """Start the arm's server (and Mooncake master), send the traffic, stop them; the per-turn records. The restart
    arm serves all but the last turn, stops its worker, and serves the last turn from a new one on the same storage."""
    from k3_sglang.hicache.mooncake_master import LoopbackMooncakeMaster
    from k3_sglang.serving.process import K3ServerProcess

    serve = ["--dtype", "float32", *arm_flags(arm, traffic, args.oversubscription), *args.serve_args]
    master = LoopbackMooncakeMaster(workdir / f"mooncake-{arm}.log").start() if arm == "host-l3" else None
    env = {} if master is None else {**master.client_env(), "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(L3_SEGMENT_BYTES)}
    if arm == "restart":
        (workdir / "file-l3").mkdir(exist_ok=True)
        env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = str(workdir / "file-l3")
    split = resumed_from(arm, traffic)  # the restart arm's new worker serves the turns from here on
    stages = [range(split), range(split, traffic.turns)] if arm == "restart" else [range(traffic.turns)]
    records: list[TurnRecord] = []
    try:
        for n, turns in enumerate(stages):
            server = K3ServerProcess(serve, workdir / f"serve-{arm}-{n}.log", env=env)
            try:
                server.start(timeout_s=args.startup_s)
                print(f"[{arm}] k3 serve {' '.join(serve)}" + (" (restarted)" if n else ""), flush=True)
                records += run_sessions(server.url, traffic, turns=turns, earlier=records, on_turn=lambda r: print(
                    f"[{arm}] session {r.session} turn {r.turn}: prompt {r.prompt_tokens}, cached {r.cached_tokens} "
                    f"{r.cached_by_tier or ''}, TTFT {r.ttft_s:.2f} s", flush=True))
                if n + 1 < len(stages):
                    time.sleep(DRAIN_S + traffic.session_tokens() / DRAIN_TOKENS_PER_S)
            finally:
                server.stop()
    finally:
        if master is not None:
            master.stop()
    return records


def run(args: argparse.Namespace) -> int:
    from k3_sglang.tooling.bench.sessions_summary import ratio, summarize
    from k3_sglang.cli import CliError

    try:
        traffic = SessionTraffic(sessions=args.sessions, first_tokens=args.first_tokens, tool_tokens=args.tool_tokens,
                                 output_tokens=args.output_tokens, turns=args.turns, think_s=args.think_s)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.turns < 2 or args.oversubscription < 1:
        raise CliError("--turns must be >= 2 (a resumed turn) and --oversubscription >= 1")
    started = datetime.datetime.now(datetime.timezone.utc)
    workdir = Path(tempfile.mkdtemp(prefix="k3-bench-sessions-"))
    records = {arm: run_arm(arm, traffic, args, workdir) for arm in args.arms}
    baseline = records.get("off") or next(iter(records.values()))
    summaries = {arm: summarize(arm, recs, baseline, resumed_from(arm, traffic)) for arm, recs in records.items()}
    for s in summaries.values():
        print(f"{s.arm:>9}: resumed TTFT p50 {s.ttft_p50_s:.2f} s p99 {s.ttft_p99_s:.2f} s, prefilled "
              f"{s.prefilled_per_turn:.0f}/{s.prompt_per_turn:.0f} tokens per turn, tiers "
              + ", ".join(f"{t} {v:.0%}" for t, v in s.tier_share.items()) + f", answers differing: {s.mismatches}")
    for slow, fast, goal in GOALS:
        value = ratio(summaries.get(slow), summaries.get(fast))
        if value is not None:
            print(f"{slow} / {fast} resumed TTFT p50: {value:.2f}x" + (f" (goal {goal[0]} {goal[1]}x)" if goal else ""))
    if str(args.out) != "-":
        from k3_sglang.tooling.bench.sessions_report import write_report

        write_report(args, traffic, started, summaries, workdir)
    return 1 if any(s.mismatches for s in summaries.values()) else 0
