"""bench/gpu_check.sh's logic on CPU: a stub `python` for every branch (no sglang, another SGLang, failures, no CUDA),
and a stand-in for the lent image (this interpreter without sglang and without the project installed) running the
real commands. The GPU run itself
happens only on a lent GPU machine. About 60 s (the stand-in collects the kernel tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$* | PYTHONPATH=${PYTHONPATH:-} GPU=${K3_KERNEL_TESTS_ON_GPU:-} INTERP=${TRITON_INTERPRET:-}" >> "$STUB_LOG"
case "$*" in
  --version) echo "Python 3.12.3 (stub)"; exit 0 ;;
  "-m pip"*) exit 99 ;;
  *"import sys, sglang"*) echo "sglang ${STUB_SGLANG_VERSION:-missing}"; exit "${STUB_SGLANG_RC:-1}" ;;
  *"else 1)"*) exit "${STUB_CUDA_RC:-0}" ;;
  *"k3_sglang.kernels.dispatch"*) echo "imports ok"; exit 0 ;;
  "-m pytest tests/kernels"*) echo "12 passed"; exit "${STUB_KERNEL_TESTS_RC:-0}" ;;
  "-m pytest tests/model"*) echo "9 passed"; exit "${STUB_MODEL_RC:-0}" ;;
  "-m pytest tests/e2e"*) echo "2 passed"; exit "${STUB_SERVE_RC:-0}" ;;
  bench/dcp_kernel_check.py*) echo "k3_dcp_mla: every case within tolerance"; exit "${STUB_DCP_RC:-0}" ;;
  bench/roofline_check.py*) echo "| H200 TP16 | 131072 | 8 | 48 | 16384 | ok |"; exit "${STUB_ROOF_RC:-0}" ;;
  bench/kernels_gpu.py*) echo "2 cases, 0 failed checks"; exit "${STUB_BENCH_RC:-0}" ;;
esac
exit 98
"""
SGLANG_OK = {"STUB_SGLANG_RC": "0", "STUB_SGLANG_VERSION": "0.5.23"}


def _run(tmp_path: Path, python: Path | None = None, **env) -> tuple[int, str, str]:
    """Run bench/gpu_check.sh with PYTHON = the stub (or `python`); (exit code, report, the stub's call log)."""
    if python is None:
        python = tmp_path / "python"
        python.write_text(STUB)
        python.chmod(0o755)
    log, report = tmp_path / "calls.log", tmp_path / "report.md"
    full_env = {**os.environ, "PYTHON": str(python), "STUB_LOG": str(log), "TRITON_INTERPRET": "1", **env}
    full_env.pop("PYTHONPATH", None)
    run = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), str(report)], capture_output=True, text=True,
                         timeout=300, env=full_env, cwd=tmp_path)
    return run.returncode, report.read_text(), log.read_text() if log.exists() else ""


def _verdicts(report: str) -> tuple[str, str]:
    lines = report.split("## verdict", 1)[1]
    kernels = lines.split("- kernels (steps 1-3): ", 1)[1].splitlines()[0]
    return kernels, lines.split("- SGLang steps (4-5): ", 1)[1].splitlines()[0]


def test_lent_image_without_sglang_passes_on_the_kernels(tmp_path):
    rc, report, calls = _run(tmp_path)
    assert rc == 0 and _verdicts(report) == ("PASS", "NOT RUN")
    assert "sglang missing" in report and "NOT RUN: they need sglang 0.5.23" in report
    assert "pip" not in calls and "tests/model" not in calls and "tests/e2e" not in calls  # nothing installed
    assert f"-m pytest tests/kernels -q -p no:cacheprovider -rs | PYTHONPATH={REPO} GPU=1 INTERP=" in calls
    assert f"bench/kernels_gpu.py --iters 30 --warmup 5 | PYTHONPATH={REPO}" in calls and "2 cases, 0 failed checks" in report


def test_sglang_steps_run_where_sglang_0_5_23_imports(tmp_path):
    rc, report, calls = _run(tmp_path, **SGLANG_OK)
    assert rc == 0 and _verdicts(report) == ("PASS", "PASS")
    assert "-m pytest tests/model -q -p no:cacheprovider -rs" in calls and "GPU=1" in calls
    assert "tests/e2e/test_serve_matches_reference.py" in calls
    assert report.count("- exit code: 0") == 7
    assert f"bench/dcp_kernel_check.py | PYTHONPATH={REPO}" in calls
    assert f"bench/roofline_check.py --iters 20 | PYTHONPATH={REPO}" in calls and "| H200 TP16 | 131072" in report


@pytest.mark.parametrize("env,expected,rc", [
    ({"STUB_SGLANG_RC": "4", "STUB_SGLANG_VERSION": "0.5.22"}, ("PASS", "NOT RUN"), 0),  # another SGLang version
    ({"STUB_KERNEL_TESTS_RC": "1"}, ("FAIL", "NOT RUN"), 1),
    ({"STUB_BENCH_RC": "1", **SGLANG_OK}, ("FAIL", "PASS"), 1),
    ({"STUB_DCP_RC": "1"}, ("FAIL", "NOT RUN"), 1),  # the k3_dcp_mla kernel check is a kernel step
    ({"STUB_ROOF_RC": "1"}, ("FAIL", "NOT RUN"), 1),  # so is the roofline measurement (a non-finite output)
    ({"STUB_SERVE_RC": "1", **SGLANG_OK}, ("PASS", "FAIL"), 1),  # a failed SGLang step fails the run, not the kernels
    ({"STUB_CUDA_RC": "1", **SGLANG_OK}, ("NOT RUN", "NOT RUN"), 1),  # no GPU: nothing passes
])
def test_verdicts(tmp_path, env, expected, rc):
    code, report, calls = _run(tmp_path, **env)
    assert (code, _verdicts(report)) == (rc, expected)
    if expected[0] == "NOT RUN":
        assert "NOT RUN: no CUDA device" in report and "tests/kernels" not in calls


def _stand_in(tmp_path: Path) -> Path:
    """An executable `python`: this interpreter without sglang and without the project installed."""
    path = tmp_path / "stand-in-python"
    path.write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" "{REPO / "tests/utils/stand_in_python.py"}" "$@"\n')
    path.chmod(0o755)
    return path


def test_script_in_a_stand_in_image_without_sglang_or_install(tmp_path):
    """The real script on this CPU host, its python standing in for the lent image: the checkout's kernels import from
    PYTHONPATH alone; no CUDA here, so the kernel verdict is NOT RUN (never a pass) and the SGLang steps NOT RUN."""
    rc, report, _ = _run(tmp_path, python=_stand_in(tmp_path))
    assert rc == 1 and _verdicts(report) == ("NOT RUN", "NOT RUN")
    assert f"k3_sglang.kernels from {REPO / 'kernels' / 'dispatch.py'}" in report
    assert "No module named 'sglang'" in report


def test_kernel_tests_and_benchmark_need_only_torch_and_triton(tmp_path):
    """What steps 2-3 run imports without sglang and without an install: every kernel test module collects, the
    benchmark script starts (and says it needs CUDA); the model tests, which need SGLang, fail to collect loudly."""
    python, env = str(_stand_in(tmp_path)), {**os.environ, "PYTHONPATH": str(REPO)}
    collect = subprocess.run([python, "-m", "pytest", "tests/kernels", "--collect-only", "-q", "-p", "no:cacheprovider"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    assert int(collect.stdout.strip().splitlines()[-1].split()[0]) > 100  # "N tests collected"
    bench = subprocess.run([python, "bench/kernels_gpu.py", "--iters", "1"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
    assert bench.returncode == 2 and "needs a CUDA GPU" in bench.stdout + bench.stderr
    model = subprocess.run([python, "-m", "pytest", "tests/model", "--collect-only", "-q", "-p", "no:cacheprovider"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert model.returncode != 0 and "No module named 'sglang" in model.stdout + model.stderr
