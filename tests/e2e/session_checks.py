"""Shared by the HiCache end-to-end tests (tests/e2e/test_hicache_*.py): round-robin agent sessions on a `k3 serve`
whose device pool is too small for them, and the checks on their per-turn records (bench/session_traffic.py)."""
from __future__ import annotations

import os

from k3_sglang.tooling.bench.session_traffic import SessionTraffic, TurnRecord, run_sessions
from k3_sglang.serving.process import K3ServerProcess

DEVICE_POOL = 2048  # tokens: holds one ~1.4K-token session, so the next round-robin turn finds its session evicted
# SGLang kills a scheduler whose step takes over 300 s (its watchdog); on a 2-core machine shared with other
# servers one step has taken longer, so the tests give it 20 minutes.
BASE_ARGS = ["--dtype", "float32", "--max-total-tokens", str(DEVICE_POOL), "--chunked-prefill-size", "256",
             "--watchdog-timeout", "1200"]
# SGLang's 2 x the device pool, given explicitly: these tests need a host tier that the sessions overflow (so that
# storage serves them); `k3 serve` alone sizes the tier from free memory (hicache/host_sizing.py).
HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "2"]


def traffic(sessions: int, turns: int) -> SessionTraffic:
    """`sessions` sessions of 1,200 tokens, 160 tokens of tool output and 8 greedy answer tokens per turn. Each
    session draws its own tokens, so a run with fewer sessions or turns is a subset of a larger one."""
    return SessionTraffic(sessions=sessions, first_tokens=1200, tool_tokens=160, output_tokens=8, turns=turns)


def serve(tiny_dir, tmp_path_factory, name: str, extra: list[str], env: dict | None = None) -> K3ServerProcess:
    log = tmp_path_factory.mktemp(name) / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), *BASE_ARGS, *extra], log, env=env)
    return proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))


def run(server: K3ServerProcess, load: SessionTraffic) -> list[TurnRecord]:
    try:
        return run_sessions(server.url, load)
    except Exception:
        print(server.log_tail(8000))
        raise


def answers(records) -> dict:
    """{(session, turn): greedy answer}."""
    return {(r.session, r.turn): r.output_ids for r in records}


def matches(records, reference: dict) -> bool:
    return all(reference[key] == answer for key, answer in answers(records).items())


def history(records) -> dict[tuple[int, int], int]:
    """(session, turn) -> tokens the session held before that turn (its cached history)."""
    seen, out = {}, {}
    for r in records:
        out[(r.session, r.turn)] = seen.get(r.session, 0)
        seen[r.session] = r.prompt_tokens + len(r.output_ids)
    return out


def assert_recomputed(records) -> None:
    """HiCache off really recomputes the evicted sessions (the device pool holds about one session)."""
    assert all(r.cached_tokens < 600 for r in records if r.turn), [r.cached_tokens for r in records]


def assert_resumed_from(records, tier: str) -> None:
    """Every resumed turn found its whole history cached, some of it in `tier` and none on the device."""
    held = history(records)
    for r in records:
        if r.turn:
            assert r.cached_tokens >= held[(r.session, r.turn)] - 1, (r, held)
            assert r.cached_by_tier.get(tier, 0) > 0 and r.cached_by_tier.get("device", 0) == 0, r


def resumed_fractions(records) -> list[float]:
    """Per resumed turn: cached tokens / the tokens the session had before this turn (its history)."""
    history, fractions = {}, []
    for rec in records:
        if rec.turn:
            fractions.append(rec.cached_tokens / history[rec.session])
        history[rec.session] = rec.prompt_tokens + len(rec.output_ids)
    return fractions
