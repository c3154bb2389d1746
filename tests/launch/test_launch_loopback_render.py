"""`k3 launch render --target cpu-loopback`: the plan -> loopback mapping, the script's dry run, its failure
exits, and the CLI's refusals. tests/e2e/test_launch_loopback.py runs the agent-100k script for real."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from k3_sglang import cli
from k3_sglang.launch.loopback import loopback_servers
from k3_sglang.plan.capacity import make_plan
from k3_sglang.plan.errors import PlanError
from k3_sglang.plan.presets import plan_preset
from k3_sglang.plan.spec import spec_from_dict
from launch_helpers import RENDERED

AGENT = RENDERED["agent-100k"]["k3-agent-100k-cpu-loopback.sh"]
LONG = RENDERED["long-context"]["k3-long-context-cpu-loopback.sh"]


def _plan(preset: str, **group_changes):
    doc = plan_preset(preset)
    for group in doc["groups"]:
        group.update(group_changes)
    return make_plan(spec_from_dict(doc))


def _shape(server) -> tuple:
    return (server.role, server.tp, server.dcp, server.pp, server.ep)


def test_agent_100k_keeps_its_roles_and_features_at_width_2():
    servers = loopback_servers(_plan("agent-100k"))
    assert [_shape(s) for s in servers] == [("prefill", 1, 1, 2, 1), ("decode", 2, 2, 1, 2)]
    assert [s.source for s in servers] == ["2 x prefill TP1 PP8", "7 x decode TP8 DCP8 EP8"]
    assert [s.index for s in servers] == [0, 1]


def test_width_4_and_8_scale_every_feature_that_is_on():
    assert [_shape(s) for s in loopback_servers(_plan("agent-100k"), 4)] == [("prefill", 1, 1, 4, 1),
                                                                             ("decode", 4, 4, 1, 4)]
    assert [_shape(s) for s in loopback_servers(_plan("long-context"), 8)] == [("unified", 8, 8, 1, 8)]


@pytest.mark.parametrize("width", [1, 9])
def test_width_out_of_range_is_refused(width):
    with pytest.raises(PlanError, match="--loopback-width"):
        loopback_servers(_plan("agent-100k"), width)


def test_dp_attention_has_no_loopback_form():
    with pytest.raises(PlanError, match="DP attention"):
        loopback_servers(_plan("long-context", dp_attention=2, tp=16, dcp=1))


def _run(text: str, tmp_path: Path, args: list[str], env: dict[str, str], timeout: float = 30):
    path = tmp_path / "loopback.sh"
    path.write_text(text)
    return subprocess.run(["bash", str(path), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def test_dry_run_prints_loopback_servers_and_the_pd_router(tmp_path):
    proc = _run(AGENT, tmp_path, ["--dry-run"], {"BASE_PORT": "41000", "BOOTSTRAP_PORT": "42000",
                                                  "ROUTER_PORT": "43000", "MODEL_PATH": "/ckpt",
                                                  "K3_SERVE_ARGS": "--dtype float32"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    prefill = next(line for line in lines if line.startswith("[dry-run] prefill-0:"))
    decode = next(line for line in lines if line.startswith("[dry-run] decode-0:"))
    assert "--model-path /ckpt" in prefill and prefill.endswith("--port 41000 --dtype float32")
    assert "--pp-size 2 --disaggregation-mode prefill --disaggregation-bootstrap-port 42000" in prefill
    assert "--tp-size 2 --dcp-size 2 --ep-size 2 --disaggregation-mode decode" in decode
    assert "--host 127.0.0.1" in prefill and "--host 127.0.0.1" in decode
    router = next(line for line in lines if line.startswith("[dry-run] router:"))
    assert router.endswith("k3 router --prefill http://127.0.0.1:41000 42000 --decode http://127.0.0.1:41001 "
                           "--host 127.0.0.1 --port 43000")


def test_unified_plans_render_a_plain_worker():
    assert "--tp-size 2 --dcp-size 2 --ep-size 2 --host 127.0.0.1" in LONG
    assert "k3 router --worker" in LONG and "--disaggregation-mode" not in LONG


def _fake_bin(tmp_path: Path, **programs: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in programs.items():
        path = bin_dir / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_server_that_exits_stops_the_script_with_its_log(tmp_path):
    path = _fake_bin(tmp_path, k3="echo fake k3 failing >&2; exit 3", curl="exit 7")
    proc = _run(AGENT, tmp_path, [], {"PATH": path, "HEALTH_POLL_S": "0.1", "HEALTH_TIMEOUT_S": "20",
                                      "LOG_DIR": str(tmp_path)})
    assert proc.returncode == 1
    assert "k3-launch: error: prefill-0: a server process exited" in proc.stderr
    # whichever server died first stopped the script (both fail here); its log is kept with what it wrote
    logs = [(tmp_path / f"{name}.log").read_text() for name in ("prefill-0", "decode-0")]
    assert "fake k3 failing\n" in logs and set(logs) <= {"", "fake k3 failing\n"}


def test_a_router_that_exits_stops_the_servers(tmp_path):
    marker = tmp_path / "stopped"
    k3 = f"""if [[ "$1" == router ]]; then exit 4; fi
trap 'echo "$$" >> {marker}; exit 0' TERM
while true; do sleep 0.1; done"""
    path = _fake_bin(tmp_path, k3=k3, curl="exit 0")
    proc = _run(AGENT, tmp_path, [], {"PATH": path, "LOG_DIR": str(tmp_path)})
    assert proc.returncode == 1
    assert "a server or the router exited (status 4)" in proc.stderr
    for _ in range(50):  # the EXIT trap signalled both servers
        if marker.exists() and len(marker.read_text().split()) == 2:
            break
        subprocess.run(["sleep", "0.1"])
    assert len(marker.read_text().split()) == 2


def test_k3_missing_from_path_is_a_clear_error(tmp_path):
    proc = _run(AGENT, tmp_path, [], {"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "k3 is not on PATH" in proc.stderr


def test_cli_refuses_a_bad_width_with_exit_2(tmp_path, capsys):
    assert cli.main(["launch", "render", "--preset", "agent-100k", "--target", "cpu-loopback",
                     "--loopback-width", "1", "--out", str(tmp_path)]) == 2
    assert "--loopback-width 1: choose 2 to 8" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_cli_writes_the_loopback_script(tmp_path, capsys):
    assert cli.main(["launch", "render", "--preset", "agent-100k", "--target", "cpu-loopback",
                     "--out", str(tmp_path)]) == 0
    script = tmp_path / "k3-agent-100k-cpu-loopback.sh"
    assert script.read_text() == AGENT and os.access(script, os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3-agent-100k-cpu-loopback.sh", "plan.yaml"]
