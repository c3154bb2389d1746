"""`k3 serve` for pipeline parallelism: PP sizes lifted in the refusal table, per-rank threads, and the refusal of
dynamic chunking for a checkpoint whose vocabulary SGLang's profiler cannot feed."""
from __future__ import annotations

import inspect
import json
import os

import pytest

from k3_sglang.cli import main
from k3_sglang.config import preset
from k3_sglang.deployment import parse_sglang_argv
from k3_sglang.serving import cli as serve_cli
from k3_sglang.serving.sglang_cpu_limits import SUPPORTED_PARALLEL_SIZES, refusals

BASE = ["--model-path", "x", "--attention-backend", "k3_cpu_mla", "--cuda-graph-backend-decode", "disabled",
        "--cuda-graph-backend-prefill", "disabled", "--mamba-radix-cache-strategy", "no_buffer",
        "--disable-overlap-schedule"]  # k3 serve's CPU defaults
PP = SUPPORTED_PARALLEL_SIZES["pp_size"].supported


def test_pp_sizes_up_to_the_table_are_served_and_beyond_it_refused():
    for size in range(2, PP + 1):
        assert refusals(parse_sglang_argv([*BASE, "--pp-size", str(size)])) == [], size
    assert any(r.startswith(f"--pp-size {PP + 1}: pipeline parallelism") for r in
               refusals(parse_sglang_argv([*BASE, "--pp-size", str(PP + 1)])))


def test_tp_x_pp_is_served():
    """TP2 x PP2 (tests/e2e/test_pp_slow.py)."""
    assert refusals(parse_sglang_argv([*BASE, "--tp-size", "2", "--pp-size", "2"])) == []


@pytest.mark.parametrize("cores,ranks,threads", [({0, 1}, 2, "1"), ({0, 1}, 4, "1"), (set(range(8)), 2, "4"),
                                                 ({0}, 2, "1")])
def test_each_pipeline_rank_gets_its_share_of_the_cores(monkeypatch, cores, ranks, threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: cores)
    env = serve_cli.serving_env(["--pp-size", str(ranks)], on_cpu=True)
    assert env["OMP_NUM_THREADS"] == threads
    assert len(env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == ranks


def test_one_rank_and_a_user_thread_count_are_left_alone(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "OMP_NUM_THREADS" not in serve_cli.serving_env([], on_cpu=True)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert serve_cli.serving_env(["--pp-size", "2"], on_cpu=True)["OMP_NUM_THREADS"] == "3"


def _checkpoint_config(folder, name: str):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(preset(name).to_hf()))
    return folder


def test_dynamic_chunking_is_refused_for_a_vocabulary_below_the_profiler_ids(tmp_path, capsys):
    tiny = _checkpoint_config(tmp_path / "tiny", "k3-tiny")
    assert main(["serve", "--model-path", str(tiny), "--pp-size", "2", "--enable-dynamic-chunking", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--enable-dynamic-chunking" in err and "1024-token vocabulary" in err
    big = _checkpoint_config(tmp_path / "pp", "k3-tiny-pp")
    assert main(["serve", "--model-path", str(big), "--pp-size", "2", "--enable-dynamic-chunking", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--enable-dynamic-chunking" in out and "OMP_NUM_THREADS=" in out


def test_sglang_profiler_still_feeds_ids_below_the_bound_we_check():
    from sglang.srt.managers.scheduler_components.dynamic_chunk_sizer import DynamicChunkSizer

    source = inspect.getsource(DynamicChunkSizer._profile_prefill_latency)
    assert f"randint(0, {serve_cli.DYNAMIC_CHUNKING_PROFILE_IDS}," in source
    assert preset("k3-tiny-pp").vocab_size >= serve_cli.DYNAMIC_CHUNKING_PROFILE_IDS
