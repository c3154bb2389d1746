"""bench/roofline_check.py (gpu_check.sh step 2c) on CPU, in a stand-in for the lent image (no sglang, no install):
without CUDA it refuses with exit 2; --dry-run runs every docs/roofline.md row through the real kernel wrapper
(Triton interpreter, contexts / 8192) and prints one finite row each, with the roofline's own figures."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from k3_sglang.tooling.bench import roofline

REPO = Path(__file__).resolve().parents[2]
STAND_IN = [sys.executable, str(REPO / "tests/utils/stand_in_python.py")]


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([*STAND_IN, "bench/roofline_check.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


def test_needs_cuda_without_dry_run():
    done = _run("--iters", "1")
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_dry_run_measures_every_roofline_row(tmp_path):
    report = tmp_path / "r.md"
    done = _run("--dry-run", "--report", str(report))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line for line in report.read_text().splitlines() if line.startswith(("| H200", "| GB300"))]
    want = roofline.rows()
    assert len(rows) == len(want)
    for line, r in zip(rows, want):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0].startswith(r.device) and int(cells[2]) == r.dcp and int(cells[3]) == r.heads
        assert cells[-1] == "ok"
