"""bench/gpu_check.sh's own logic on CPU (a stub `python` stands in for the GPU machine's), and the KDA bandwidth
goal verdict of bench/kernels_gpu.py on synthetic rows. The GPU run itself happens only on a lent GPU machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from k3_sglang.tooling.bench.kernels import Row

REPO = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
echo "$* | GPU=${K3_KERNEL_TESTS_ON_GPU:-} INTERP=${TRITON_INTERPRET:-}" >> "$STUB_LOG"
case "$1 ${2:-}" in
  "-c import sglang") exit "${STUB_SGLANG_RC:-1}" ;;
  "-m pip") [[ "$*" == *"[test]"* ]] && exit "${STUB_PIP_RC:-0}"; exit 0 ;;
  "-m pytest") echo "12 passed"; exit "${STUB_PYTEST_RC:-0}" ;;
  "--version ") echo "Python 3.12.3 (stub)"; exit 0 ;;
esac
case "$1" in
  bench/kernels_gpu.py) echo "goal >= 70 % of measured bandwidth at every batch: met"; exit 0 ;;
  -c) echo "imports ok"; exit 0 ;;
esac
exit 99
"""


def _run(tmp_path: Path, **env) -> tuple[int, str, str]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log, report = tmp_path / "calls.log", tmp_path / "report.md"
    full_env = {**os.environ, "PYTHON": str(stub), "STUB_LOG": str(log), "TRITON_INTERPRET": "1", **env}
    run = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), str(report)], capture_output=True, text=True,
                         timeout=120, env=full_env, cwd=tmp_path)
    return run.returncode, report.read_text(), log.read_text()


def test_gpu_check_without_sglang_reports_the_serve_step_as_not_run(tmp_path):
    rc, report, calls = _run(tmp_path, STUB_PIP_RC="1")  # no package index: falls back to --no-deps
    assert rc == 1  # a step that could not run is not a pass
    for section in ("## 1. install", "## 2. kernel tests, compiled", "## 3. tiny K3 on CUDA", "## 4. kernel benchmark",
                    "## verdict"):
        assert section in report, section
    assert "NOT RUN: SGLang is not importable" in report and "- exit code: 3" in report
    assert "at least one step did not exit 0" in report
    assert "--no-deps --no-build-isolation --ignore-requires-python -e ." in calls
    assert "-m pytest tests/kernels -q -p no:cacheprovider -rs | GPU=1 INTERP=" in calls  # compiled, not interpreted
    assert "bench/kernels_gpu.py --iters 30 --warmup 5" in calls and "met" in report


def test_gpu_check_all_steps_pass(tmp_path):
    rc, report, calls = _run(tmp_path, STUB_SGLANG_RC="0")
    assert rc == 0 and "every step exited 0" in report
    assert "tests/e2e/test_serve_matches_reference.py" in calls
    assert report.count("- exit code: 0") == 4


def _kernels_gpu():
    spec = importlib.util.spec_from_file_location("kernels_gpu", REPO / "bench" / "kernels_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fractions,verdict", [([0.8, 0.71], "met"), ([0.9, 0.5], "MISSED")])
def test_kda_goal_verdict(fractions, verdict):
    module = _kernels_gpu()
    bw = 4e12
    rows = [Row("kda_decode", f"B={b}", 1.0, f * bw * 1e-3, 0.0, "ok 1e-4") for b, f in zip((1, 64), fractions)]
    rows.append(Row("mla_decode", "B=1", 1.0, 0.1 * bw * 1e-3, 0.0, "ok"))
    lines = module.kda_goal_lines(rows, bw)
    assert len(lines) == 3 and lines[-1].startswith(f"goal >= 70 % of measured bandwidth at every batch: {verdict}")
    assert f"worst {min(fractions) * 100:.0f} %" in lines[-1]
    assert module.kda_goal_lines([Row("kda_decode", "B=1", 1.0, 0.9 * bw * 1e-3, 0.0, "FAIL 1e-1")], bw)[-1].find(
        "MISSED") > 0  # a failed check never meets the goal
