"""SGLang's HiCache on `k3 serve` (CPU, portable K3, float32): round-robin agent sessions on a device pool too small
for them are resumed from the host tier (L2) or from storage (L3: the file backend, Mooncake store with its master
started here), and every greedy answer is token-identical to the same traffic on a server with HiCache off.

Default tier (about 4 minutes on 2 cores: two server starts): host tier vs HiCache off.
Slow tier: the sabotage control (a server that corrupts every KDA state it restores must give different answers),
the file backend, Mooncake store, and the Mooncake master killed mid-session (the server stays up, answers stay
identical: the lost tier falls back to recompute; SGLang logs the failed storage writes, Mooncake its lost master).
"""

from __future__ import annotations

import os

import httpx
import pytest

from k3_sglang.bench.session_traffic import SessionTraffic, run_sessions
from k3_sglang.hicache.mooncake_master import LoopbackMooncakeMaster
from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
DEVICE_POOL = 2048  # tokens: holds one ~1.4K-token session, so the next round-robin turn finds its session evicted


def _traffic(sessions: int, turns: int) -> SessionTraffic:
    return SessionTraffic(sessions=sessions, first_tokens=1200, tool_tokens=160, output_tokens=8, turns=turns)


L2_TRAFFIC = _traffic(3, 2)  # 3 sessions: the host tier (2 x the device pool) holds them all
L3_TRAFFIC = _traffic(6, 2)  # 6 sessions: they fall out of the host tier too and come back from storage
BASE_ARGS = ["--dtype", "float32", "--max-total-tokens", str(DEVICE_POOL), "--chunked-prefill-size", "256"]
HICACHE = ["--enable-hierarchical-cache"]


def _serve(tiny_dir, tmp_path_factory, name: str, extra: list[str], env: dict | None = None) -> K3ServerProcess:
    log = tmp_path_factory.mktemp(name) / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), *BASE_ARGS, *extra], log, env=env)
    return proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))


def _run(server: K3ServerProcess, traffic: SessionTraffic):
    try:
        return run_sessions(server.url, traffic)
    except Exception:
        print(server.log_tail(8000))
        raise


@pytest.fixture(scope="module")
def reference_answers(tiny_dir, tmp_path_factory):
    """{(session, turn): answer} of six sessions x three turns on a server with HiCache off (every resumed turn
    recomputed). Each session draws its own tokens, so a run with fewer sessions or turns is a subset."""
    server = _serve(tiny_dir, tmp_path_factory, "serve-off", [])
    try:
        records = _run(server, _traffic(6, 3))
    finally:
        server.stop()
    assert all(r.cached_tokens < 600 for r in records if r.turn)  # off really recomputes the evicted sessions
    return {(r.session, r.turn): r.output_ids for r in records}


def _answers(records) -> dict:
    return {(r.session, r.turn): r.output_ids for r in records}


def _matches(records, reference: dict) -> bool:
    return all(reference[key] == answer for key, answer in _answers(records).items())


def _history(records) -> dict[tuple[int, int], int]:
    """(session, turn) -> tokens the session held before that turn (its cached history)."""
    seen, out = {}, {}
    for r in records:
        out[(r.session, r.turn)] = seen.get(r.session, 0)
        seen[r.session] = r.prompt_tokens + len(r.output_ids)
    return out


def _assert_resumed_from(records, tier: str) -> None:
    history = _history(records)
    for r in records:
        if r.turn:
            assert r.cached_tokens >= history[(r.session, r.turn)] - 1, (r, history)
            assert r.cached_by_tier.get(tier, 0) > 0 and r.cached_by_tier.get("device", 0) == 0, r


def test_sessions_resumed_from_the_host_tier_match_hicache_off(tiny_dir, tmp_path_factory, reference_answers):
    server = _serve(tiny_dir, tmp_path_factory, "serve-l2", HICACHE)
    try:
        records = _run(server, L2_TRAFFIC)
        assert "hicache_attached=True" in server.log_tail(10 ** 7)
    finally:
        server.stop()
    _assert_resumed_from(records, "host")
    assert _matches(records, reference_answers)


@pytest.mark.slow
def test_sabotage_corrupting_restored_kda_states_changes_the_answers(tiny_dir, tmp_path_factory, reference_answers):
    server = _serve(tiny_dir, tmp_path_factory, "serve-l2-sabotage", HICACHE,
                    env={"K3_HICACHE_FAULT": "corrupt-restored-kda"})
    try:
        records = _run(server, L2_TRAFFIC)
    finally:
        server.stop()
    _assert_resumed_from(records, "host")  # the same restores happen ...
    assert not _matches([r for r in records if r.turn], reference_answers)  # ... and the comparison catches them


@pytest.mark.slow
def test_sessions_resumed_from_file_storage_match_hicache_off(tiny_dir, tmp_path_factory, reference_answers):
    storage = tmp_path_factory.mktemp("l3-file")
    server = _serve(tiny_dir, tmp_path_factory, "serve-l3-file", HICACHE + ["--hicache-storage-backend", "file"],
                    env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(storage)})
    try:
        records = _run(server, L3_TRAFFIC)
    finally:
        server.stop()
    assert any(storage.iterdir())
    _assert_resumed_from(records, "storage")
    assert _matches(records, reference_answers)


@pytest.mark.slow
def test_mooncake_store_tier_and_master_killed_mid_session(tiny_dir, tmp_path_factory, reference_answers):
    master = LoopbackMooncakeMaster(tmp_path_factory.mktemp("mooncake") / "master.log").start()
    server = None
    try:
        server = _serve(tiny_dir, tmp_path_factory, "serve-l3-mooncake",
                        HICACHE + ["--hicache-storage-backend", "mooncake"], env=master.client_env())
        records = _run(server, L3_TRAFFIC)
        master.kill()
        after = _run(server, _traffic(6, 3))  # the same sessions again and a third turn, without L3
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        log = server.log_tail(10 ** 7)
    finally:
        if server is not None:
            server.stop()
        master.stop()
    _assert_resumed_from(records, "storage")
    assert _matches(records, reference_answers) and _matches(after, reference_answers)  # nothing lost
    assert all(r.cached_by_tier.get("storage", 0) == 0 for r in after)
    assert "Write page to storage" in log and "Failed to ping master" in log  # the fall-back is logged
