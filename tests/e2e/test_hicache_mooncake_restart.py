"""Restart with the Mooncake store (issue 42): a worker stopped mid-conversation and started again on the same master
resumes its sessions from the store with the uninterrupted run's greedy answers. Mooncake keeps objects in the
memory segments its clients mount and a `k3 serve` rank mounts its own, which dies with it; so the store's memory
is a standalone `mooncake_client` (k3_sglang/hicache/mooncake_master.py `LoopbackMooncakeSegment`) and the worker
mounts none (MOONCAKE_GLOBAL_SEGMENT_SIZE=0). The file-backend restart: tests/e2e/test_hicache_sessions.py.

Slow tier: three server starts (HiCache off for the reference, the worker, the restarted worker), 3 sessions.
"""

from __future__ import annotations

import pytest

from k3_sglang.hicache.mooncake_master import LoopbackMooncakeMaster
from tests.e2e.session_checks import HICACHE, answers, assert_recomputed, matches, run, serve, traffic

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def reference_answers(tiny_dir, tmp_path_factory):
    """{(session, turn): answer} of three sessions x three turns on a server with HiCache off."""
    server = serve(tiny_dir, tmp_path_factory, "mooncake-restart-off", [])
    try:
        records = run(server, traffic(3, 3))
    finally:
        server.stop()
    assert_recomputed(records)
    return answers(records)


def test_restarted_worker_resumes_from_a_mooncake_segment_that_outlives_it(tiny_dir, tmp_path_factory,
                                                                            reference_answers):
    """Mooncake store restart: the objects live in a standalone `mooncake_client`'s segment (the worker mounts
    none, MOONCAKE_GLOBAL_SEGMENT_SIZE=0), so a worker stopped after two turns and started again (new process, same
    master and segment) resumes every session's third turn from the store with the uninterrupted run's answer."""
    import time

    from k3_sglang.hicache.mooncake_master import LoopbackMooncakeSegment
    from k3_sglang.tooling.bench.session_traffic import generate, plan_session_prompts

    logs = tmp_path_factory.mktemp("mooncake-restart")
    master = LoopbackMooncakeMaster(logs / "master.log").start()
    segment = None
    try:
        segment = LoopbackMooncakeSegment(logs / "segment.log", master).start()
        args = HICACHE + ["--hicache-storage-backend", "mooncake"]
        load = traffic(3, 3)
        first = serve(tiny_dir, tmp_path_factory, "serve-mooncake-restart-1", args, env=segment.worker_env())
        try:
            before = run(first, traffic(3, 2))
            time.sleep(3)  # between turns: the write-through queue drains
        finally:
            first.stop()
        assert matches(before, reference_answers)
        openings, tools = plan_session_prompts(load)
        outputs = answers(before)
        turn3 = [openings[s] + list(outputs[(s, 0)]) + tools[s][0] + list(outputs[(s, 1)]) + tools[s][1]
                 for s in range(3)]
        again = serve(tiny_dir, tmp_path_factory, "serve-mooncake-restart-2", args, env=segment.worker_env())
        try:
            resumed = [generate(again.url, ids, load.output_tokens) for ids in turn3]
        finally:
            again.stop()
    finally:
        if segment is not None:
            segment.stop()
        master.stop()
    for s, rec in enumerate(resumed):
        last_prompt = len(turn3[s]) - len(tools[s][1]) - load.output_tokens  # as the file-backend restart test
        assert rec.cached_tokens >= last_prompt and rec.cached_by_tier.get("storage", 0) > 0, rec
        assert rec.cached_by_tier.get("device", 0) == 0, rec
        assert tuple(rec.output_ids) == tuple(reference_answers[(s, 2)]), s
