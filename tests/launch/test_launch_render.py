"""Rendered launchers: golden files, bash -n, shellcheck, dry runs, failure exits, LWS fields."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from k3_sglang.launch.golden import EXAMPLE_PRESETS, EXAMPLES_DIR
from launch_helpers import RENDERED, require_shellcheck, scripts, serve_commands

SLURM = RENDERED["agent-100k"]["k3-agent-100k.sbatch"]
SHELL = RENDERED["long-context"]["k3-long-context.sh"]
LWS = RENDERED["agent-100k"]["k3-agent-100k-lws.yaml"]
TRAYS = " ".join(f"tray{i}" for i in range(18))


@pytest.mark.parametrize("preset", EXAMPLE_PRESETS)
def test_examples_match_the_generator(preset):
    folder = EXAMPLES_DIR / preset
    on_disk = {p.name: p.read_text() for p in folder.iterdir()}
    assert on_disk.keys() == RENDERED[preset].keys(), "re-run: python -m k3_sglang.launch.golden"
    for name, text in RENDERED[preset].items():
        assert on_disk[name] == text, f"{preset}/{name} drifted; re-run: python -m k3_sglang.launch.golden"


@pytest.mark.parametrize("name, text", scripts(), ids=[n for n, _ in scripts()])
def test_scripts_pass_bash_n_and_shellcheck(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    subprocess.run(["bash", "-n", str(path)], check=True)
    proc = subprocess.run([require_shellcheck(), "-s", "bash", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _run(text: str, tmp_path: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    path = tmp_path / "launch.sh"
    path.write_text(text)
    return subprocess.run(["bash", str(path), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


def test_slurm_dry_run_prints_every_tray_and_the_router(tmp_path):
    proc = _run(SLURM, tmp_path, ["--dry-run"], {"K3_NODES": TRAYS})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum("k3 serve" in line for line in lines) == 18
    assert any("--disaggregation-mode prefill" in line and "--pp-size 8" in line for line in lines)
    assert any("--disaggregation-mode decode" in line and "--dcp-size 8" in line for line in lines)
    assert any("--dist-init-addr tray4:5002" in line and "--node-rank 1" in line for line in lines)
    router = [line for line in lines if "k3 router" in line]
    assert len(router) == 1 and "--port 8000" in router[0] and "--worker" not in router[0]
    # PD: the router pairs 2 prefill servers (with their bootstrap ports) and 7 decode servers
    assert router[0].count("--prefill") == 2 and router[0].count("--decode") == 7
    assert "--prefill http://tray0:30000 8998 --prefill http://tray2:30001 8999" in router[0]


def test_shell_dry_run_per_host(tmp_path):
    env = {"K3_NODE_ADDRS": "10.0.0.1 10.0.0.2"}
    head = _run(SHELL, tmp_path, ["0", "--dry-run"], env)
    other = _run(SHELL, tmp_path, ["1", "--dry-run"], env)
    assert head.returncode == 0 and other.returncode == 0, head.stderr + other.stderr
    assert "--node-rank 0" in head.stdout and "k3 router --worker http://10.0.0.1:30000" in head.stdout
    assert "--node-rank 1" in other.stdout and "k3 router" not in other.stdout
    assert "--dist-init-addr 10.0.0.1:5000" in other.stdout


def test_shell_pins_the_nic():
    assert 'export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-eth0}"' in SHELL
    assert 'export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-eth0}"' in SHELL
    assert "--moe-runner-backend marlin" in SHELL


def test_slurm_sets_mooncake_over_mnnvl():
    assert "export MC_FORCE_MNNVL=True" in SLURM and "export SGLANG_MOONCAKE_CUSTOM_MEM_POOL=True" in SLURM
    assert "--disaggregation-transfer-backend mooncake" in SLURM and "#SBATCH --nodes=18" in SLURM


@pytest.mark.parametrize("args, env, fragment", [
    (["0", "--dry-run"], {"K3_NODE_ADDRS": "10.0.0.1"}, "set K3_NODE_ADDRS to the 2 host addresses"),
    (["7"], {}, "usage:"),
    ([], {}, "usage:"),
])
def test_shell_bad_arguments_fail_with_a_message(tmp_path, args, env, fragment):
    proc = _run(SHELL, tmp_path, args, {"K3_NODE_ADDRS": "", **env})
    assert proc.returncode != 0 and fragment in proc.stderr


def _fake_bin(tmp_path: Path, **programs: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in programs.items():
        path = bin_dir / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_shell_exits_nonzero_when_a_server_dies(tmp_path):
    path = _fake_bin(tmp_path, k3="echo fake k3 failing >&2; exit 3", curl="exit 7")
    proc = _run(SHELL, tmp_path, ["0"], {"PATH": path, "K3_NODE_ADDRS": "127.0.0.1 127.0.0.2",
                                          "HEALTH_POLL_S": "0.1", "HEALTH_TIMEOUT_S": "20"})
    assert proc.returncode == 1
    assert "k3-launch: error: unified-0: a server process exited" in proc.stderr


def test_slurm_exits_nonzero_when_health_times_out(tmp_path):
    path = _fake_bin(tmp_path, srun="exec sleep 30", curl="exit 7")
    proc = _run(SLURM, tmp_path, [], {"PATH": path, "K3_NODES": TRAYS, "HEALTH_POLL_S": "0.1",
                                       "HEALTH_TIMEOUT_S": "1"})
    assert proc.returncode == 1
    assert "k3-launch: error: prefill-0:" in proc.stderr and "not ready after 1s" in proc.stderr


def test_slurm_refuses_a_short_allocation(tmp_path):
    proc = _run(SLURM, tmp_path, ["--dry-run"], {"K3_NODES": "a b c"})
    assert proc.returncode == 1 and "the plan needs 18 trays, the allocation has 3" in proc.stderr


def test_lws_manifests_carry_the_required_fields():
    docs = [d for d in yaml.safe_load_all(LWS) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ComputeDomain", "LeaderWorkerSet", "LeaderWorkerSet", "Deployment", "Service"]
    for lws in (d for d in docs if d["kind"] == "LeaderWorkerSet"):
        assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["metadata"]["name"]
        template = lws["spec"]["leaderWorkerTemplate"]
        assert isinstance(lws["spec"]["replicas"], int) and template["size"] == 2
        for role in ("leaderTemplate", "workerTemplate"):
            container = template[role]["spec"]["containers"][0]
            assert container["name"] and container["image"] and container["command"][:2] == ["k3", "serve"]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
            command = container["command"]
            assert command[command.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
            assert command[command.index("--dist-init-addr") + 1].startswith("$(LWS_LEADER_ADDRESS):")
        assert template["leaderTemplate"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health"
    replicas = {d["metadata"]["name"]: d["spec"]["replicas"] for d in docs if d["kind"] == "LeaderWorkerSet"}
    assert replicas == {"k3-agent-100k-prefill": 2, "k3-agent-100k-decode": 7}
    router = docs[3]["spec"]["template"]["spec"]
    command = router["containers"][0]["command"]
    assert command.count("--prefill") == 2 and command.count("--decode") == 7 and "--worker" not in command
    assert command[command.index("--prefill") + 2] == "8998"  # the prefill group's bootstrap port
    assert "exit 1" in router["initContainers"][0]["command"][2]


def test_every_script_serves_with_k3_serve():
    for name, text in scripts():
        commands = serve_commands(text)
        assert commands and all(c[:2] == ["k3", "serve"] for c in commands), name
