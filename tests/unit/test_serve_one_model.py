"""`k3 serve` runs one model, SGLang's own K3 (`sglang.srt.models.kimi_k3`), on CUDA and on CPU: the composed SGLang
command and environment on a (mocked) CUDA host and on CPU, the retired K3_MODEL_IMPL, and the K3-specific choices
on CPU (DCP prefix cache, K3_CSV's refusals and its pipeline relay).

No GPU is needed: CUDA detection is mocked and `os.execvpe` is replaced by a recorder, so each test inspects
exactly what would have been executed (and a refusal must leave the recorder unused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from k3_sglang.cli import main
from k3_sglang.config import preset
from k3_sglang.deployment import parse_sglang_argv
from k3_sglang.serving import sglang_cpu_limits
from k3_sglang.serving.cli import serving_env, sglang_argv


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
    for name in ("SGLANG_PLATFORM", "K3_MODEL_IMPL", "SGLANG_EXTERNAL_MODEL_PACKAGE", "SGLANG_ENABLE_PP_SPEC"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _on_cuda(monkeypatch, cuda: bool = True) -> None:
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: cuda)


def _flag(command: list[str], flag: str) -> str | None:
    """The last value given for flag (SGLang's parser keeps the last)."""
    return command[len(command) - 1 - command[::-1].index(flag) + 1] if flag in command else None


def test_cuda_full_checkpoint_keeps_sglang_model_and_quantization(monkeypatch, launched, full_checkpoint):
    _on_cuda(monkeypatch)
    # exported by an earlier shell (the retired portable model's package): must not leak into a GPU server
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "k3_sglang.models")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    user = ["--tp-size", "8", "--dcp-size", "8", "--speculative-algorithm", "EAGLE"]
    assert main(["serve", "--model-path", str(full_checkpoint), *user]) == 0
    [(command, env)] = launched
    assert command[1:3] == ["-m", "k3_sglang.serving.launch"]
    assert command[-len(user):] == user  # passed through to SGLang's own K3, not refused
    assert "--json-model-override-args" not in command and not any("quantization_config" in w for w in command)
    for ours in ("--mamba-radix-cache-strategy", "--disable-overlap-schedule", "--cuda-graph-backend-decode",
                 "--max-total-tokens", "--sleep-on-idle", "--attention-backend"):
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


def test_cuda_tiny_checkpoint_is_served_by_sglangs_k3_too(monkeypatch, launched, capsys):
    _on_cuda(monkeypatch)
    assert main(["serve", "--dtype", "float32", "--dry-run"]) == 0
    assert "# model: SGLang's K3 (sglang.srt.models.kimi_k3) on CUDA" in capsys.readouterr().out
    assert main(["serve", "--dtype", "float32"]) == 0
    [(command, env)] = launched
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in env and "SGLANG_PLATFORM" not in env
    assert "--json-model-override-args" not in command and "--attention-backend" not in command
    assert "--max-total-tokens" not in command  # the CPU memory caps stay on CPU


def test_cpu_serves_sglangs_k3_on_the_k3_cpu_platform(monkeypatch, launched, capsys):
    _on_cuda(monkeypatch, cuda=False)
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "k3_sglang.models")  # an inherited export must not leak
    assert main(["serve", "--dtype", "float32", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# model: SGLang's K3 (sglang.srt.models.kimi_k3) on the k3_cpu platform" in out
    assert "-SGLANG_EXTERNAL_MODEL_PACKAGE" in out
    assert main(["serve", "--dtype", "float32"]) == 0
    [(command, env)] = launched
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in env and env["SGLANG_PLATFORM"] == "k3_cpu"
    assert env["SGLANG_MAMBA_CONV_DTYPE"] == "float32"
    assert _flag(command, "--attention-backend") == "k3_cpu_mla"
    assert json.loads(_flag(command, "--json-model-override-args")) == {"language_model_only": True}  # quant kept
    assert _flag(command, "--mamba-radix-cache-strategy") == "no_buffer" and "--disable-overlap-schedule" in command
    assert _flag(command, "--cuda-graph-backend-decode") == "disabled" and "--sleep-on-idle" in command
    assert _flag(command, "--max-total-tokens") is not None
    parsed = parse_sglang_argv(command[3:])
    assert parsed.attention_backend == "k3_cpu_mla" and parsed.quantization is None


def test_retired_model_impl_portable_exits_2_and_other_values_are_ignored_with_a_warning(monkeypatch, launched,
                                                                                          capsys):
    _on_cuda(monkeypatch, cuda=False)
    monkeypatch.setenv("K3_MODEL_IMPL", "portable")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "K3_MODEL_IMPL=portable: the portable K3 model has retired" in err and "unset K3_MODEL_IMPL" in err
    assert not launched
    for value in ("sglang", "auto"):
        monkeypatch.setenv("K3_MODEL_IMPL", value)
        assert main(["serve"]) == 0
        assert f"warning: K3_MODEL_IMPL={value} is ignored" in capsys.readouterr().err
    assert len(launched) == 2 and all(env["SGLANG_PLATFORM"] == "k3_cpu" for _, env in launched)


def test_every_reason_in_one_message_config_yaml_included(monkeypatch, launched, capsys, tmp_path):
    _on_cuda(monkeypatch, cuda=False)
    config = tmp_path / "server.yaml"
    config.write_text("pp-size: 16\n")  # SGLang's --config file is read the way SGLang reads it
    assert main(["serve", "--config", str(config), "--enable-torch-compile", "--speculative-algorithm", "EAGLE"]) == 2
    err = capsys.readouterr().err
    assert all(m in err for m in ("--pp-size 16", "--enable-torch-compile", "--speculative-algorithm EAGLE"))
    assert not launched


def test_k3_csv_in_a_pipeline_is_served_with_sglangs_pp_spec_relay(monkeypatch):
    """K3_CSV under --pp-size passes the CPU checks and `k3 serve` turns on SGLang's PP speculation relay
    (SGLANG_ENABLE_PP_SPEC, which spec/pp_hooks.py requires), on CPU and CUDA; no other command line gets it."""
    monkeypatch.delenv("SGLANG_ENABLE_PP_SPEC", raising=False)
    flags = ["--speculative-algorithm", "K3_CSV", "--pp-size", "2"]
    assert sglang_cpu_limits.refusals(parse_sglang_argv(sglang_argv(Path("/m"), "127.0.0.1", 1, flags))) == []
    assert serving_env(flags, on_cpu=True)["SGLANG_ENABLE_PP_SPEC"] == "1"
    assert serving_env(flags, on_cpu=False)["SGLANG_ENABLE_PP_SPEC"] == "1"
    for other in (["--speculative-algorithm", "K3_CSV"], ["--pp-size", "2"]):
        assert "SGLANG_ENABLE_PP_SPEC" not in serving_env(other, on_cpu=True), other
    eagle = ["--speculative-algorithm", "EAGLE", "--pp-size", "2"]
    assert "SGLANG_ENABLE_PP_SPEC" not in serving_env(eagle, on_cpu=False)


def test_k3_serve_picks_the_kda_prefix_cache_under_dcp():
    """Under DCP: the k3_dcp_mla backend and extra_buffer (DCP's radix pages need its snapshots); with K3_CSV or PD,
    no_buffer and no radix cache (verify leaves no track snapshots; PD's decode pool: one KDA slot per request)."""
    def argv(flags, on_cpu=True):
        return sglang_argv(Path("/m"), "127.0.0.1", 1, flags, on_cpu=on_cpu)

    dcp = argv(["--tp-size", "2", "--dcp-size", "2"])
    assert _flag(dcp, "--mamba-radix-cache-strategy") == "extra_buffer" and "--disable-radix-cache" not in dcp
    assert _flag(dcp, "--attention-backend") == "k3_dcp_mla"
    assert sglang_cpu_limits.refusals(parse_sglang_argv(dcp)) == []
    plain = argv(["--tp-size", "2"])
    assert _flag(plain, "--mamba-radix-cache-strategy") == "no_buffer" and "--disable-radix-cache" not in plain
    chosen = argv(["--tp-size", "2", "--dcp-size", "2", "--mamba-radix-cache-strategy", "no_buffer",
                   "--disable-radix-cache"])
    assert _flag(chosen, "--mamba-radix-cache-strategy") == "no_buffer"  # the user's choice stands
    assert sglang_cpu_limits.refusals(parse_sglang_argv(chosen)) == []
    spec = argv(["--tp-size", "2", "--dcp-size", "2", "--speculative-algorithm", "K3_CSV"])
    assert _flag(spec, "--mamba-radix-cache-strategy") == "no_buffer" and "--disable-radix-cache" in spec
    assert sglang_cpu_limits.refusals(parse_sglang_argv(spec)) == []
    pd = argv(["--tp-size", "2", "--dcp-size", "2", "--disaggregation-mode", "decode"])
    assert _flag(pd, "--mamba-radix-cache-strategy") == "no_buffer" and "--disable-radix-cache" in pd
    cuda = argv(["--dcp-size", "2"], on_cpu=False)
    assert "--mamba-radix-cache-strategy" not in cuda and "--disable-radix-cache" not in cuda  # SGLang picks itself


K3_CSV_REFUSED = [
    (["--pp-size", "2", "--disaggregation-mode", "prefill"],
     "--speculative-algorithm K3_CSV with --pp-size 2 and --disaggregation-mode prefill"),
    (["--speculative-num-draft-tokens", "1"], "K3_CSV needs at least 2"),
    (["--mamba-radix-cache-strategy", "extra_buffer"], "K3_CSV with --mamba-radix-cache-strategy extra_buffer"),
    (["--attention-backend", "k3_dcp_mla", "--decode-attention-backend", "k3_dcp_mla"], None),  # served
]


@pytest.mark.parametrize("flags,message", K3_CSV_REFUSED, ids=[" ".join(f)[:40] for f, _ in K3_CSV_REFUSED])
def test_k3_csv_refusals_on_cpu(monkeypatch, launched, capsys, flags, message):
    _on_cuda(monkeypatch, cuda=False)
    code = main(["serve", "--speculative-algorithm", "K3_CSV", *flags])
    if message is None:
        assert code == 0 and len(launched) == 1
        return
    assert code == 2 and message in capsys.readouterr().err
    assert not launched


@pytest.mark.parametrize("variable,value,message", [
    ("K3_SPEC_VERIFY_MODE", "sometimes", "K3_SPEC_VERIFY_MODE must be one of compact, static, decode"),
    ("K3_SPEC_DRAFTER", "controlled", "K3_SPEC_DRAFTER=controlled needs K3_SPEC_ORACLE"),
    ("K3_SPEC_FORCE_VERIFY_LEN", "many", "K3_SPEC_FORCE_VERIFY_LEN must be an integer"),
    ("K3_SPEC_LOOKUP_WINDOW", "-1", "K3_SPEC_LOOKUP_WINDOW must be >= 0"),
])
def test_bad_k3_spec_settings_refused_before_any_server_starts(monkeypatch, launched, capsys, variable, value,
                                                                message):
    _on_cuda(monkeypatch, cuda=False)
    monkeypatch.setenv(variable, value)
    assert main(["serve", "--speculative-algorithm", "K3_CSV"]) == 2
    assert message in capsys.readouterr().err
    assert not launched
