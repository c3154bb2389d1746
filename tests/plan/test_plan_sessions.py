"""Cached (paused) sessions: the sizing rule `k3 serve` applies on CPU and the figures `k3 plan` reports."""

from __future__ import annotations

import math

import pytest

from k3_sglang.cli import main
from k3_sglang.plan import PlanError
from k3_sglang.plan.sessions import (UNCAPPED, device_cached_sessions, device_state_slots, host_split,
                                     states_per_cached_session)
from k3_sglang.serving.cli import cpu_state_slots, sglang_argv

from plan_helpers import plan_for

SESSION_6K = 6000 + 256  # the sessions: 6,000-token openings, 256 tokens per turn


def test_uncapped_paths_hold_one_state_per_prefill_chunk():
    assert states_per_cached_session(6000, 512, UNCAPPED) == 13
    assert states_per_cached_session(6000, 512, 2) == 2
    assert states_per_cached_session(100, 512, 4) == 2  # one chunk + the finished turn


def test_the_old_cpu_pool_cached_about_five_6k_sessions_and_the_new_one_is_kv_bound():
    old = device_cached_sessions(131072, 64, SESSION_6K, states_per_cached_session(SESSION_6K, 512, UNCAPPED))
    assert old.binding == "state" and old.sessions == 4 and old.by_kv == 20
    slots = cpu_state_slots(sglang_argv(__import__("pathlib").Path("m"), "127.0.0.1", 1, [], on_cpu=True))
    # Uncapped (issue 42: the cap dropped shared-prefix states): 3 states per 1,024 tokens in 512-token chunks.
    assert slots == device_state_slots(131072, 48, 3, 3, 1024) == 3 * 48 + 3 * 128
    per_session = states_per_cached_session(SESSION_6K, 512, UNCAPPED)  # every chunk's state + the turn's
    new = device_cached_sessions(131072, slots - 3 * 48, SESSION_6K, per_session)  # every running slot taken
    assert new.binding == "kv" and new.sessions == 131072 // SESSION_6K == 20


def test_default_state_pool_keeps_every_chunk_state_of_eight_paused_6k_sessions():
    """The issue-42 case: 8 sessions of ~6K tokens, 3 turns (+8 answer, +256 tool tokens), with no cap on states
    per path: every chunk boundary (shared prefixes resume there) and every turn's tail fit beside 48 running
    requests' slots."""
    slots = cpu_state_slots(sglang_argv(__import__("pathlib").Path("m"), "127.0.0.1", 1, [], on_cpu=True))
    turns = [math.ceil(6000 / 512) + 1] + [math.ceil(264 / 512) + 1] * 2  # chunk states + tail, per turn
    assert 8 * sum(turns) + 3 * 48 <= slots


@pytest.mark.parametrize("extra, expected", [
    (["--max-total-tokens", "16384", "--chunked-prefill-size", "128"], 3 * 48 + 9 * 16),  # 8 chunks + the turn
    (["--max-running-requests", "4"], 3 * 4 + 3 * 128),
    (["--mamba-max-states-per-path", "2"], 3 * 48 + 2 * 128),  # a cap you pass sizes the pool with it
    (["--mamba-max-states-per-path", "-1"], 3 * 48 + 3 * 128),  # 1,024 tokens in 512-token chunks + the turn
    (["--disable-radix-cache"], 48),
    # extra_buffer keeps one tracked state per --mamba-track-interval (256), not per 512-token chunk
    (["--tp-size", "2", "--dcp-size", "2"], 4 * 48 + 5 * 128),
    (["--tp-size", "2", "--dcp-size", "2", "--mamba-track-interval", "1024"], 4 * 48 + 3 * 128),
    (["--mamba-radix-cache-strategy", "auto"], None),  # refused later by the CPU limits, with the reason
    (["--mamba-max-states-per-path", "0"], None),
])
def test_cpu_state_slots_follow_the_command_line(tmp_path, extra, expected):
    argv = sglang_argv(tmp_path, "127.0.0.1", 1, extra, on_cpu=True)
    sizes = [argv[i + 1] for i, a in enumerate(argv) if a == "--max-mamba-cache-size"]
    assert sizes == ([] if expected is None else [str(expected)])


def test_a_command_line_sglang_refuses_is_refused_when_parsed(tmp_path):
    """The command line is parsed once, by SGLang's parser: a bad value is refused there, naming the flag."""
    with pytest.raises(ValueError, match="--max-running-requests"):
        sglang_argv(tmp_path, "127.0.0.1", 1, ["--max-running-requests", "many"], on_cpu=True)


def test_user_state_pool_and_gpu_hosts_are_left_alone(tmp_path):
    argv = sglang_argv(tmp_path, "127.0.0.1", 1, ["--max-mamba-cache-size", "64"], on_cpu=True)
    assert argv.count("--max-mamba-cache-size") == 1 and argv[argv.index("--max-mamba-cache-size") + 1] == "64"
    assert "--max-mamba-cache-size" not in sglang_argv(tmp_path, "127.0.0.1", 1, [], on_cpu=False)


def test_host_split_follows_the_session_and_refuses_a_host_below_one_session():
    split = host_split(10 << 30, 100_000, 1000, 50 << 20, 2, dcp=4)
    assert split.kv_bytes_per_session == 25_000 * 1000 and split.state_bytes_per_session == 100 << 20
    assert split.kv_fraction == pytest.approx(25_000_000 / (25_000_000 + (100 << 20)), rel=1e-6)
    assert split.sessions == (10 << 30) // (25_000_000 + (100 << 20))
    with pytest.raises(PlanError, match="host-memory: .*cannot hold one session"):
        host_split(100 << 20, 100_000, 1000, 50 << 20, 2, dcp=4)


def test_plan_reports_cached_sessions_on_device_and_host():
    result = plan_for(groups=[{"tp": 8, "ep": 8, "dcp": 8}], serving={"hicache_host_gib": 64.0})
    g = result.groups[0]
    assert g.states_per_session == 2
    assert g.cached_device.by_kv == g.bound.sessions_by_kv  # the same KV ceiling as running sessions
    assert g.cached_device.by_state == g.bound.memory.state_slots // 2 and g.cached_device.binding == "kv"
    assert g.cached_host == g.host.sessions > 0
    uncapped = plan_for(groups=[{"tp": 8, "ep": 8}], serving={"mamba_states_per_path": -1,
                                                              "mamba_full_memory_ratio": "auto"})
    u = uncapped.groups[0]
    assert u.states_per_session == 14  # 104,096 tokens in 8,192-token chunks + the turn
    assert u.cached_device.binding == "state"  # the GPU ceiling issue 31 describes: state slots bind first


def test_plan_cli_shows_cached_columns_and_refuses_a_tiny_host(capsys):
    assert main(["plan", "--system", "gb300-nvl72", "--tp", "8", "--ep", "8", "--hicache-host-gib", "64"]) == 0
    out = capsys.readouterr().out
    assert "cached dev" in out and "cached host" in out and "host tier:" in out
    assert main(["plan", "--system", "gb300-nvl72", "--tp", "8", "--ep", "8", "--hicache-host-gib", "0.1"]) == 2
    assert "host-memory" in capsys.readouterr().err
