"""Bad input to this wave's new entry points: each exits 2 (or raises) with a message naming what is wrong.

`k3 router --session-home`, `--curve-key` / `--curve-server-key`, `k3 router replay --replicas`, `k3 hooks ACTION`
and `K3_KV_EVENTS_CURVE` (K3_ALLOW_SGLANG_VERSION and the CURVE key-file settings are covered in
test_sglang_guard.py and tests/router/test_event_curve.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "data" / "router" / "tool-agent-200.jsonl"


def _k3(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k3_sglang.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.mark.parametrize("args,message", [
    (("router", "--worker", "http://127.0.0.1:9", "--session-home", "bogus"), "--session-home"),
    (("router", "--worker", "http://127.0.0.1:9", "--curve-key", "/nonexistent/k3.key_secret",
      "--curve-server-key", "/nonexistent/server.key"), "--curve-key: no certificate file"),
    (("router", "replay", str(TRACE), "--replicas", "0"), "--replicas must be >= 2"),
    (("hooks", "bogus"), "invalid choice: 'bogus'"),
])
def test_bad_arguments_exit_2_naming_the_flag(args, message):
    run = _k3(*args)
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert message in run.stderr, run.stderr[-2000:]


def test_a_bad_curve_setting_is_refused(monkeypatch):
    from k3_sglang.serving.kv_events_config import KvEventsSettings

    monkeypatch.setenv("K3_KV_EVENTS_CURVE", "maybe")
    with pytest.raises(ValueError, match="K3_KV_EVENTS_CURVE must be one of auto, on, off, got 'maybe'"):
        KvEventsSettings.from_env()
