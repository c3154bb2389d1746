"""The two SGLang small-shape bugs of docs/sglang-bugs.md are still in the pinned SGLang (each reproducer exits 1 and
prints REPRODUCED under Triton's interpreter, its control shape passing). When a release fixes one, this fails:
then drop the workaround named in the doc."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "sglang_bugs"


@pytest.mark.parametrize("script", ["attn_res_small_hidden.py", "mla_decode_small_latent.py"])
def test_reproducer_still_reproduces_on_the_pinned_sglang(script):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("SGLANG_PLATFORM", None)
    run = subprocess.run([sys.executable, str(SCRIPTS / script)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "REPRODUCED" in run.stdout
    assert "control" in run.stdout and ("0 outputs differ" in run.stdout or "(Lk 576): ok" in run.stdout)
