"""The benchmark entry points import on CPU; the GPU one exits cleanly with code 2; the CPU one runs tiny."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from k3_sglang.tooling.bench import kda_prefill, kernels

REPO = Path(__file__).resolve().parents[2]


def _args(module, argv):
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_bench_kernels_exits_2_on_cpu(capsys):
    assert kernels.run(_args(kernels, [])) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    out = subprocess.run([sys.executable, str(REPO / "bench" / "kernels_gpu.py")], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr


def test_bench_cases_import_without_cuda():
    import k3_sglang.tooling.bench.kernel_cases as cases

    assert callable(cases.bench_mla) and kernels.n_sets(kernels.L2_ROTATE_BYTES / 4) == 4


def test_bench_kda_prefill_tiny(tmp_path, capsys):
    args = _args(kda_prefill, ["--tokens", "70", "--heads", "1", "--head-dim", "8", "--repeats", "1",
                               "--out", str(tmp_path / "r.md")])
    assert kda_prefill.run(args) == 0
    text = (tmp_path / "r.md").read_text()
    assert "chunk_kda, chunk 64" in text and "T=70" in text
