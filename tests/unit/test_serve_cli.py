"""`k3 serve` argument handling, the CPU platform entry point, the namespace (the request guard: test_request_guard.py)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys

import pytest

from k3_sglang.cli import main
from k3_sglang.serving.cli import sglang_argv, serving_env


def test_dry_run_prints_sglang_command_with_defaults(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path))
    assert main(["serve", "--dry-run", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "k3_sglang.serving.launch" in out and "--host 127.0.0.1 --port 30000" in out
    assert "--reasoning-parser kimi_k3" in out and "--tool-call-parser kimi_k3" in out
    assert "--dtype float32" in out
    assert (tmp_path / "k3-tiny-v3" / "model.safetensors").exists()


def test_user_flags_override_defaults(tmp_path):
    argv = sglang_argv(tmp_path, "127.0.0.1", 1234, ["--max-total-tokens", "999", "--tp-size", "2"], on_cpu=True)
    assert argv.count("--max-total-tokens") == 1 and argv[argv.index("--max-total-tokens") + 1] == "999"
    env = serving_env(["--tp-size", "2", "--pp-size", "2"], on_cpu=True)
    assert env["SGLANG_PLATFORM"] == "k3_cpu" and len(env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 4
    assert env.get("SGLANG_EXTERNAL_MODEL_PACKAGE") != "k3_sglang.models"  # the portable model has retired
    no_tok = sglang_argv(tmp_path, "127.0.0.1", 1, ["--skip-tokenizer-init"], on_cpu=True)
    assert "--tool-call-parser" not in no_tok


def test_bad_model_path_is_a_clear_cli_error(tmp_path, capsys):
    assert main(["serve", "--model-path", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 1}}))
    assert main(["serve", "--model-path", str(tmp_path)]) == 2
    assert "invalid K3 config" in capsys.readouterr().err


def test_bad_settings_and_port(monkeypatch, capsys):
    monkeypatch.setenv("K3_MAX_N", "zero")
    assert main(["serve", "--dry-run"]) == 2
    assert "K3_MAX_N" in capsys.readouterr().err
    monkeypatch.delenv("K3_MAX_N")
    monkeypatch.setenv("K3_SPEC_DRAFTER", "psychic")  # the workers' settings, checked before SGLang starts
    assert main(["serve", "--dry-run"]) == 2
    assert "K3_SPEC_DRAFTER must be one of" in capsys.readouterr().err
    monkeypatch.delenv("K3_SPEC_DRAFTER")
    assert main(["serve", "--port", "70000", "--dry-run"]) == 2


def test_module_entry_exits_2_on_bad_input(tmp_path):
    run = subprocess.run([sys.executable, "-m", "k3_sglang.cli", "serve", "--model-path", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no such folder" in run.stderr


def test_platform_entry_point_is_inert_unless_selected(monkeypatch):
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.platforms") if ep.name == "k3_cpu"]
    assert eps, "k3_cpu platform entry point is not installed"
    fn = eps[0].load()
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    assert fn() is None
    probe = ("from sglang.srt.platforms import current_platform as p; "
             "print(type(p).__name__, p.get_device(), p.get_default_attention_backend(), p.is_cuda(), p.is_out_of_tree())")
    env = {**__import__("os").environ, "SGLANG_PLATFORM": "k3_cpu"}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-5:] == ["K3CpuPlatform", "cpu", "torch_native", "False", "True"]


def test_namespaced_packages_and_hf_kernels_both_import():
    ours = importlib.import_module("k3_sglang.kernels")
    hf = importlib.import_module("kernels")
    assert ours.__name__ == "k3_sglang.kernels" and hf.__name__ == "kernels"
    assert ours.__file__ != hf.__file__
    importlib.import_module("k3_sglang.parallel")
    importlib.import_module("k3_sglang.launch")


def test_make_tiny_and_bench_serve_bad_input(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["make-tiny", str(blocker)]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["bench", "serve", "--concurrency", "0", "--out", "-"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["make-tiny"])
    assert exc.value.code == 2
