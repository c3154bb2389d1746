"""What `k3 serve` refuses for SGLang's own K3 on the k3_cpu platform (serving/sglang_cpu_limits.py): exit 2
before any server starts, every reason named, one test per refusal; and the launcher's re-check of a parsed
ServerArgs."""
from __future__ import annotations

import os

import pytest

from k3_sglang.cli import main
from k3_sglang.serving import sglang_cpu_limits
from k3_sglang.deployment import parse_sglang_argv


@pytest.fixture
def cpu_sglang(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(os, "execvpe", lambda *a: calls.append(a))
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    monkeypatch.delenv("K3_MODEL_IMPL", raising=False)
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    return calls


REFUSED = [
    (["--tp-size", "8"], "--tp-size 8: tensor parallelism"),
    (["--pp-size", "8"], "--pp-size 8: pipeline parallelism"),
    (["--dcp-size", "8"], "--dcp-size 8: decode context parallelism"),
    (["--tp-size", "4", "--ep-size", "8"], "--ep-size 8: expert parallelism"),
    (["--tp-size", "4"], "--tp-size 4 with --ep-size 1: each rank's slice of the MXFP4 routed experts' intermediate "
                         "(64 / 4 = 16) is not a multiple of the 32-element scale group; use --ep-size 2"),
    (["--dp-size", "2"], "--dp-size 2: data-parallel replicas"),
    (["--attention-backend", "triton"], "--attention-backend triton: K3's MLA runs on the k3_cpu_mla or k3_dcp_mla backend"),
    (["--decode-attention-backend", "flashinfer"], "--decode-attention-backend flashinfer"),
    (["--mamba-radix-cache-strategy", "extra_buffer_lazy"], "--mamba-radix-cache-strategy extra_buffer_lazy"),
    (["--linear-attn-decode-backend", "flashinfer"], "--linear-attn-decode-backend flashinfer"),
    (["--moe-runner-backend", "deep_gemm"], "--moe-runner-backend deep_gemm"),
    (["--kv-cache-dtype", "fp8_e4m3"], "--kv-cache-dtype fp8_e4m3"),
    (["--dtype", "float16"], "--dtype float16"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm EAGLE"),
    (["--enable-dp-attention"], "--enable-dp-attention"),
    (["--enable-torch-compile"], "--enable-torch-compile"),
    (["--enable-hierarchical-cache", "--hicache-io-backend", "kernel"], "--hicache-io-backend kernel: on CPU"),
    (["--cuda-graph-backend-decode", "full"], "CUDA graphs for decode (full)"),
]


@pytest.mark.parametrize("flags,reason", REFUSED, ids=[r[0][0] + (r[0][-1] if len(r[0]) > 1 else "") for r in REFUSED])
def test_each_refusal_exits_2_naming_the_flag(cpu_sglang, capsys, flags, reason):
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert "SGLang's K3 cannot serve this configuration on the k3_cpu platform" in err
    assert reason in err
    assert not cpu_sglang, "no server may start"


def test_every_reason_is_listed_at_once(cpu_sglang, capsys):
    assert main(["serve", "--pp-size", "8", "--attention-backend", "triton", "--enable-torch-compile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n  - ") == 3


def test_the_defaults_and_the_tested_sizes_pass(cpu_sglang):
    tested = ([], ["--tp-size", "2", "--ep-size", "2"], ["--pp-size", "2"], ["--dtype", "bfloat16"],
              ["--tp-size", "2", "--dcp-size", "2"], ["--tp-size", "4", "--ep-size", "4", "--dcp-size", "4"],
              ["--pp-size", "4"])
    for flags in tested:
        assert main(["serve", *flags]) == 0
    assert len(cpu_sglang) == len(tested)


def test_overlap_scheduler_is_refused_with_no_buffer():
    args = parse_sglang_argv(["--model-path", "x", "--attention-backend", "k3_cpu_mla", "--cuda-graph-backend-decode",
                              "disabled", "--cuda-graph-backend-prefill", "disabled"])
    assert [r for r in sglang_cpu_limits.refusals(args) if "overlap scheduler" in r]


def test_launcher_rechecks_a_parsed_server_args(monkeypatch, tmp_path, capsys):
    """A --config file can carry what the CLI never saw: the launcher refuses it from SGLang's ServerArgs."""
    from k3_sglang.serving import launch

    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    config = tmp_path / "server.yaml"
    config.write_text("attention-backend: triton\n")
    monkeypatch.setattr("sglang.srt.plugins.load_plugins", lambda: None)
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--model-path", str(tmp_path), "--config", str(config)])
    assert exit_info.value.code == 2
    assert "--attention-backend triton" in capsys.readouterr().err
