"""The host tier's session eviction (k3_sglang/hicache/session_eviction.py) end to end: six round-robin sessions of
~1.4K tokens on a 2,048-token device pool and SGLang's 2 x host tier (4,096 tokens, about 2.5 of them) with no
storage. SGLang's LRU (K3_HICACHE_EVICTION=lru, the default) evicts each session just before its turn comes back; the
session policy (K3_HICACHE_EVICTION=sessions, opt-in: the `k3` radix cache on its K3SessionTreeCore,
serving/radix_cache.py) keeps a stable set resumed from the host tier. Every answer of both equals HiCache off.

Slow tier (three server starts, 18 requests each; 3 min 13 s on the 2-core AMD EPYC VM, 2026-12-07: host-tier share
of the 12 resumed turns' history LRU all 0, sessions 1.0 0.64 0 0 0.64 0.85 0 0 0.56 0.56 0.19 0); the policy itself
is unit-tested in tests/unit/test_hicache_session_eviction.py (a toy tier: LRU 0 hits, the policy 58% of the
history).
"""

from __future__ import annotations

import pytest

from tests.e2e.session_checks import HICACHE, answers, assert_recomputed, history, run, serve, traffic

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2700)]
LOAD = traffic(6, 3)  # 6 x ~1.4K-token sessions over a ~4K-token host tier: about 2.5 of them fit


def host_hits(records) -> list[float]:
    """Per resumed turn: tokens served from the host tier / the session's history before the turn."""
    held = history(records)
    return [r.cached_by_tier.get("host", 0) / held[(r.session, r.turn)] for r in records if r.turn]


def test_session_eviction_resumes_sessions_that_lru_evicts_and_answers_as_hicache_off(tiny_dir, tmp_path_factory):
    server = serve(tiny_dir, tmp_path_factory, "evict-off", [])
    try:
        reference = run(server, LOAD)
    finally:
        server.stop()
    assert_recomputed(reference)

    arms = {}
    for name, eviction in (("lru", "lru"), ("sessions", "sessions")):
        server = serve(tiny_dir, tmp_path_factory, f"evict-{name}", HICACHE, env={"K3_HICACHE_EVICTION": eviction})
        try:
            arms[name] = run(server, LOAD)
            log = server.log_tail(10 ** 7)
        finally:
            server.stop()
        assert "hicache_attached=True" in log
        assert answers(arms[name]) == answers(reference), name  # greedy answers identical to HiCache off
    lru, sessions = host_hits(arms["lru"]), host_hits(arms["sessions"])
    print(f"host-tier share of each resumed turn's history: lru {[round(f, 2) for f in lru]}, "
          f"sessions {[round(f, 2) for f in sessions]}")
    assert sum(f >= 0.5 for f in sessions) >= 4  # about 2 of 6 sessions resume each round
    assert sum(sessions) > 2 * sum(lru)
    assert all(r.cached_by_tier.get("device", 0) < 600 for r in arms["sessions"] if r.turn)  # hits are the tier's
