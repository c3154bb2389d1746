"""The portable K3 model refuses, at start, every configuration it cannot serve correctly: exit 2, a message that
names the reason, and no server started (os.execvpe is replaced by a recorder that must stay unused)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from k3_sglang.cli import main
from k3_sglang.serving import portable_limits
from k3_sglang.serving.portable_limits import SUPPORTED_PARALLEL_SIZES, parse_sglang_argv, portable_refusals

REFUSED = [
    (["--tp-size", "3"], "--tp-size 3 does not divide the MLA head count (4)"),
    (["--tp", "16"], "--tp-size 16: tensor parallelism is not built into the portable model yet"),
    (["--tp-size", "4", "--ep-size", "3"], "--ep-size 3 must divide --tp-size 4"),
    (["--pp-size", "8"], "--pp-size 8: pipeline parallelism"),
    (["--dcp-size", "16"], "--dcp-size 16: decode context parallelism"),
    (["--tp-size", "2", "--dcp-size", "4"], "--dcp-size 4 must divide the attention TP size (2)"),
    (["--attn-dp-size", "2"], "--attn-dp-size 2: DP attention"),
    (["--dp-size", "2", "--enable-dp-attention"], "--enable-dp-attention: DP attention"),
    (["--ep-size", "16"], "--ep-size 16: expert parallelism"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm EAGLE: not supported by the portable model"),
    (["--speculative-algorithm", "NGRAM"], "--speculative-algorithm NGRAM: not supported"),
    (["--speculative-algorithm", "K3_CSV", "--pp-size", "2", "--disaggregation-mode", "prefill"],
     "--speculative-algorithm K3_CSV with --pp-size 2 and --disaggregation-mode prefill"),
    (["--speculative-algorithm", "K3_CSV", "--speculative-num-draft-tokens", "1"], "K3_CSV needs at least 2"),
    (["--speculative-algorithm", "K3_CSV", "--mamba-radix-cache-strategy", "extra_buffer"],
     "K3_CSV with --mamba-radix-cache-strategy extra_buffer"),
    (["--mamba-radix-cache-strategy", "extra_buffer_lazy"], "extra_buffer_lazy: the portable model serves no_buffer and extra_buffer"),
    (["--tp-size", "2", "--dcp-size", "2", "--mamba-radix-cache-strategy", "no_buffer"],
     "--dcp-size 2 with the radix cache and --mamba-radix-cache-strategy no_buffer"),
    (["--mamba-radix-cache-strategy", "auto"], "--mamba-radix-cache-strategy auto"),
    (["--cuda-graph-backend-decode", "full"], "CUDA graphs for decode (full)"),
    (["--cuda-graph-backend-prefill", "breakable"], "CUDA graphs for prefill (breakable)"),
    (["--cuda-graph-config", '{"decode": {"backend": "full", "max_bs": 8}}'], "CUDA graphs for decode (full)"),
]


@pytest.fixture
def launched(monkeypatch, tmp_path):
    calls: list[list[str]] = []
    monkeypatch.setattr(os, "execvpe", lambda file, command, env: calls.append(list(command)))
    monkeypatch.setenv("K3_CACHE_DIR", os.environ.get("K3_CACHE_DIR", str(tmp_path)))
    monkeypatch.delenv("K3_MODEL_IMPL", raising=False)
    return calls


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda-tiny"])
@pytest.mark.parametrize("flags,message", REFUSED, ids=[" ".join(f)[:40] for f, _ in REFUSED])
def test_refused_before_any_server_starts(monkeypatch, launched, capsys, cuda, flags, message):
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: cuda)
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert "k3 serve: error: the portable K3 model (k3_sglang.models) cannot serve this configuration" in err
    assert message in err
    assert not launched


def test_every_reason_in_one_message(monkeypatch, launched, capsys, tmp_path):
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    config = tmp_path / "server.yaml"
    config.write_text("pp-size: 8\n")  # SGLang's --config file is read the way SGLang reads it
    assert main(["serve", "--config", str(config), "--tp-size", "3", "--speculative-algorithm", "EAGLE"]) == 2
    err = capsys.readouterr().err
    assert all(m in err for m in ("--tp-size 3", "--pp-size 8", "--speculative-algorithm EAGLE"))
    assert not launched


def test_supported_configurations_pass(monkeypatch, launched):
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    for flags in ([], ["--tp-size", "1", "--disable-cuda-graph"], ["--mamba-radix-cache-strategy", "no_buffer"],
                  ["--mamba-radix-cache-strategy", "extra_buffer"], ["--tp-size", "2", "--dcp-size", "2"],
                  ["--tp-size", "2", "--dcp-size", "2", "--mamba-radix-cache-strategy", "no_buffer",
                   "--disable-radix-cache"],
                  ["--cuda-graph-backend-decode", "disabled", "--disable-radix-cache"]):
        launched.clear()
        assert main(["serve", *flags]) == 0, flags
        assert len(launched) == 1


def test_k3_csv_in_a_pipeline_is_served_with_sglangs_pp_spec_relay(monkeypatch):
    """K3_CSV under --pp-size passes the portable checks and `k3 serve` turns on SGLang's PP speculation relay
    (SGLANG_ENABLE_PP_SPEC, which spec/pp_hooks.py requires), for either K3 model; no other command line gets it."""
    from k3_sglang.serving.cli import serving_env

    monkeypatch.delenv("SGLANG_ENABLE_PP_SPEC", raising=False)
    flags = ["--speculative-algorithm", "K3_CSV", "--pp-size", "2"]
    assert portable_refusals(parse_sglang_argv([*PORTABLE_BASE, *flags])) == []
    assert serving_env(flags, on_cpu=True)["SGLANG_ENABLE_PP_SPEC"] == "1"
    for other in (["--speculative-algorithm", "K3_CSV"], ["--pp-size", "2"]):
        assert "SGLANG_ENABLE_PP_SPEC" not in serving_env(other, on_cpu=True), other
    # SGLang's K3 runs K3_CSV on the same relay (spec/contract.py); its own algorithms follow SGLang's rules
    assert serving_env(flags, on_cpu=False, portable=False)["SGLANG_ENABLE_PP_SPEC"] == "1"
    eagle = ["--speculative-algorithm", "EAGLE", "--pp-size", "2"]
    assert "SGLANG_ENABLE_PP_SPEC" not in serving_env(eagle, on_cpu=False, portable=False)


PORTABLE_BASE = ["--model-path", "x", "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill",
                 "disabled", "--mamba-radix-cache-strategy", "no_buffer", "--disable-radix-cache"]  # (as under DCP)


def test_parallel_table_lifts_one_limit_at_a_time(monkeypatch):
    assert portable_refusals(parse_sglang_argv(PORTABLE_BASE)) == []
    for field, limit in SUPPORTED_PARALLEL_SIZES.items():
        args = parse_sglang_argv([*PORTABLE_BASE, limit.flag, str(limit.supported + 1)])
        assert getattr(args, field) == limit.supported + 1, (field, "SGLang's parser must fill this field")
        assert [r for r in portable_refusals(args) if r.startswith(limit.flag)], field
        lifted = {**SUPPORTED_PARALLEL_SIZES, field: dataclasses.replace(limit, supported=limit.supported + 1)}
        monkeypatch.setattr(portable_limits, "SUPPORTED_PARALLEL_SIZES", lifted)
        assert portable_refusals(args) == [], field
        monkeypatch.setattr(portable_limits, "SUPPORTED_PARALLEL_SIZES", SUPPORTED_PARALLEL_SIZES)


def test_server_process_rechecks_its_server_args(tmp_path):
    """`python -m k3_sglang.serving.launch` run directly (not through `k3 serve`) refuses too, from SGLang's
    prepared ServerArgs, before SGLang starts anything."""
    from k3_sglang.serving.cli import ensure_tiny_checkpoint
    from k3_sglang.serving.settings import ServeSettings

    tiny = ensure_tiny_checkpoint(ServeSettings.from_env())
    config = tmp_path / "server.yaml"
    config.write_text("dcp-size: 2\n")
    env = {**os.environ, "SGLANG_PLATFORM": "k3_cpu", "SGLANG_EXTERNAL_MODEL_PACKAGE": "k3_sglang.models"}
    run = subprocess.run([sys.executable, "-m", "k3_sglang.serving.launch", "--model-path", str(tiny),
                          "--config", str(config), "--host", "127.0.0.1", "--port", "1"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "--dcp-size 2 must divide the attention TP size (1)" in run.stderr
    assert "--mamba-radix-cache-strategy auto" in run.stderr  # SGLang's default: not composed by k3 serve here
    assert "CUDA graphs for decode (SGLang's default: on)" in run.stderr  # not composed by k3 serve here
    assert "Uvicorn" not in run.stderr and "ready" not in run.stdout


def test_k3_serve_picks_the_extra_buffer_kda_prefix_cache_under_dcp_only():
    from pathlib import Path

    from k3_sglang.serving.cli import sglang_argv

    def strategy(argv: list[str]) -> str | None:
        i = len(argv) - 1 - argv[::-1].index("--mamba-radix-cache-strategy") if "--mamba-radix-cache-strategy" in argv else -1
        return argv[i + 1] if i >= 0 else None

    dcp = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2", "--dcp-size", "2"], on_cpu=True)
    assert strategy(dcp) == "extra_buffer" and "--disable-radix-cache" not in dcp
    assert portable_refusals(parse_sglang_argv(dcp)) == []
    plain = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2"], on_cpu=True)
    assert strategy(plain) == "no_buffer" and "--disable-radix-cache" not in plain
    chosen = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--dcp-size", "2", "--mamba-radix-cache-strategy", "no_buffer",
                                                      "--disable-radix-cache"], on_cpu=True)
    assert strategy(chosen) == "no_buffer"  # the user's choice stands
    spec = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2", "--dcp-size", "2", "--speculative-algorithm",
                                                    "K3_CSV"], on_cpu=True)
    assert strategy(spec) == "no_buffer" and "--disable-radix-cache" in spec  # verify leaves no track snapshots
    assert portable_refusals(parse_sglang_argv(spec)) == []
    pd = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--tp-size", "2", "--dcp-size", "2", "--disaggregation-mode",
                                                  "decode"], on_cpu=True)
    assert strategy(pd) == "no_buffer" and "--disable-radix-cache" in pd  # one KDA slot per request, as planned
    sglangs = sglang_argv(Path("/m"), "127.0.0.1", 1, ["--dcp-size", "2"], on_cpu=False, portable=False)
    assert strategy(sglangs) is None and "--disable-radix-cache" not in sglangs  # SGLang's own K3 picks itself


@pytest.mark.parametrize("variable,value,message", [
    ("K3_SPEC_VERIFY_MODE", "sometimes", "K3_SPEC_VERIFY_MODE must be one of compact, static, decode"),
    ("K3_SPEC_DRAFTER", "controlled", "K3_SPEC_DRAFTER=controlled needs K3_SPEC_ORACLE"),
    ("K3_SPEC_FORCE_VERIFY_LEN", "many", "K3_SPEC_FORCE_VERIFY_LEN must be an integer"),
    ("K3_SPEC_LOOKUP_WINDOW", "-1", "K3_SPEC_LOOKUP_WINDOW must be >= 0"),
])
def test_bad_k3_spec_settings_refused_before_any_server_starts(monkeypatch, launched, capsys, variable, value,
                                                                message):
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    monkeypatch.setenv(variable, value)
    assert main(["serve", "--speculative-algorithm", "K3_CSV"]) == 2
    assert message in capsys.readouterr().err
    assert not launched
