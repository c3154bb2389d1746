"""Dry run of every `k3 bench kernels` case on CPU (Triton interpreter, tiny shapes, wall-clock timer), so the GPU
script's own code (shapes, argument order, checks) is exercised before a GPU ever runs it."""
import argparse
import time

import pytest
import torch

from k3_sglang.tooling.bench import kernels
from k3_sglang.tooling.bench import kernel_cases as cases

pytestmark = pytest.mark.triton

TINY = dict(MLA_HEADS=3, MLA_LAT=24, MLA_V=16, MERGE_SHAPE=(3, 2, 3, 16), MLA_CHECK=(2, 30), CUDA="cpu")


def _wall_ms(fn, iters, warmup):
    fn(0)
    t0 = time.perf_counter()
    fn(1)
    return (time.perf_counter() - t0) * 1e3


def test_bench_kernels_dry_run(monkeypatch, capsys):
    for name, value in TINY.items():
        monkeypatch.setattr(cases, name, value)
    monkeypatch.setattr(cases, "median_ms", _wall_ms)
    monkeypatch.setattr(kernels, "L2_ROTATE_BYTES", 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: None)
    args = argparse.Namespace(batches=[2], iters=1, warmup=0, context=40, only=None)
    rows = kernels.run_cases(args, bw=1e9, tflops=1.0)
    out = capsys.readouterr().out
    names = {r.name for r in rows}
    assert names == {"mla_decode", "merge_attention_states"}, out
    failed = [(r.name, r.check) for r in rows if not r.check.startswith("ok")]
    assert not failed, out
    assert "mla_decode" in out and "% bw" in out
