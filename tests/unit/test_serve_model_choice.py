"""Which K3 `k3 serve` runs: the composed SGLang command and environment on a (mocked) CUDA host and on CPU.

No GPU is needed: CUDA detection is mocked and `os.execvpe` is replaced by a recorder, so each test inspects
exactly what would have been executed.
"""

from __future__ import annotations

import json
import os

import pytest

from k3_sglang.cli import main
from k3_sglang.config import preset
from k3_sglang.serving.model_choice import choose_model, is_tiny_config
from k3_sglang.serving.portable_limits import parse_sglang_argv


@pytest.fixture
def full_checkpoint(tmp_path):
    """A folder whose config.json is K3-full's (the published nested layout, MXFP4 quantization config inside)."""
    folder = tmp_path / "Kimi-K3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(preset("k3-full").to_hf()))
    return folder


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """Record (command, env) instead of exec'ing SGLang; the environment starts clean of our variables."""
    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execvpe", lambda file, command, env: calls.append((list(command), dict(env))))
    monkeypatch.setenv("K3_CACHE_DIR", os.environ.get("K3_CACHE_DIR", str(tmp_path)))
    for name in ("SGLANG_PLATFORM", "K3_MODEL_IMPL", "SGLANG_EXTERNAL_MODEL_PACKAGE"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _on_cuda(monkeypatch, cuda: bool = True) -> None:
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: cuda)


def _flag(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_cuda_full_checkpoint_keeps_sglang_model_and_quantization(monkeypatch, launched, full_checkpoint):
    _on_cuda(monkeypatch)
    # exported by an earlier shell or a test process: must not leak into a GPU server
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "k3_sglang.models")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    user = ["--tp-size", "8", "--dcp-size", "8", "--speculative-algorithm", "EAGLE"]
    assert main(["serve", "--model-path", str(full_checkpoint), *user]) == 0
    [(command, env)] = launched
    assert command[1:3] == ["-m", "k3_sglang.serving.launch"]
    assert command[-len(user):] == user  # passed through to SGLang's own K3, not refused
    assert "--json-model-override-args" not in command and not any("quantization_config" in w for w in command)
    for ours in ("--mamba-radix-cache-strategy", "--disable-overlap-schedule", "--cuda-graph-backend-decode",
                 "--max-total-tokens", "--sleep-on-idle"):
        assert ours not in command, ours
    assert _flag(command, "--reasoning-parser") == "kimi_k3" and _flag(command, "--tool-call-parser") == "kimi_k3"
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in env  # SGLang's registry keeps sglang.srt.models.kimi_k3
    assert "SGLANG_PLATFORM" not in env and "TRITON_INTERPRET" not in env
    parsed = parse_sglang_argv(command[3:])  # SGLang's own parser: its defaults stand for model and quantization
    assert parsed.json_model_override_args == parse_sglang_argv(["--model-path", "x"]).json_model_override_args
    assert parsed.quantization is None and parsed.tp_size == 8 and parsed.dcp_size == 8


def test_cuda_keeps_a_foreign_external_model_package(monkeypatch, launched, full_checkpoint):
    _on_cuda(monkeypatch)
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "someone_elses.models")
    assert main(["serve", "--model-path", str(full_checkpoint)]) == 0
    assert launched[0][1]["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "someone_elses.models"


def test_cuda_tiny_checkpoint_gets_the_portable_model(monkeypatch, launched):
    _on_cuda(monkeypatch)
    assert main(["serve", "--dtype", "float32"]) == 0
    [(command, env)] = launched
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "k3_sglang.models" and "SGLANG_PLATFORM" not in env
    assert json.loads(_flag(command, "--json-model-override-args")) == {"language_model_only": True,
                                                                         "quantization_config": None}
    assert _flag(command, "--mamba-radix-cache-strategy") == "no_buffer" and "--disable-overlap-schedule" in command
    assert _flag(command, "--cuda-graph-backend-decode") == "disabled"
    assert _flag(command, "--cuda-graph-backend-prefill") == "disabled"
    assert "--max-total-tokens" not in command  # the CPU memory caps stay on CPU


def test_cuda_portable_on_request(monkeypatch, launched, full_checkpoint, capsys):
    _on_cuda(monkeypatch)
    monkeypatch.setenv("K3_MODEL_IMPL", "portable")
    assert main(["serve", "--model-path", str(full_checkpoint), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# model: portable K3" in out and "K3_MODEL_IMPL=portable" in out
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE=k3_sglang.models" in out and not launched


def test_cpu_serves_the_portable_model(monkeypatch, launched):
    _on_cuda(monkeypatch, cuda=False)
    assert main(["serve"]) == 0
    [(command, env)] = launched
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "k3_sglang.models" and env["SGLANG_PLATFORM"] == "k3_cpu"
    assert "--json-model-override-args" in command and "--sleep-on-idle" in command
    assert _flag(command, "--max-total-tokens") is not None


def test_bad_model_impl_settings_exit_2(monkeypatch, launched, capsys):
    _on_cuda(monkeypatch, cuda=False)
    monkeypatch.setenv("K3_MODEL_IMPL", "fast")
    assert main(["serve"]) == 2
    assert "K3_MODEL_IMPL must be one of auto, portable, sglang, got 'fast'" in capsys.readouterr().err
    assert not launched


def test_choice_rules():
    assert choose_model("auto", on_cpu=True, tiny=False).portable
    assert choose_model("auto", on_cpu=False, tiny=True).portable
    assert not choose_model("auto", on_cpu=False, tiny=False).portable
    assert not choose_model("sglang", on_cpu=False, tiny=True).portable
    assert choose_model("portable", on_cpu=False, tiny=False).portable
    tiny = preset("k3-tiny")
    assert is_tiny_config(tiny) and not is_tiny_config(preset("k3-full"))
    import dataclasses

    assert is_tiny_config(dataclasses.replace(tiny, name="k3-tiny-v2", max_position_embeddings=4096))
    assert not is_tiny_config(dataclasses.replace(tiny, hidden_size=256))
