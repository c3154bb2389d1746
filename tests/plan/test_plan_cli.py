"""`k3 plan` end to end, in-process through k3_sglang.cli.main (and once as the console script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3_sglang.cli import main

REPO = Path(__file__).resolve().parents[2]
K3_SCRIPT = Path(sys.executable).parent / "k3"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_table_names_the_binding_ceiling(capsys):
    code, out, _ = run(capsys, "plan", "--preset", "agent-100k")
    assert code == 0
    assert "27,648 B/token" in out and "decode TP8 DCP8 EP8" in out and "kda-state-slots" in out
    assert "total: 72 GPUs" in out


def test_json_round_trips_through_a_plan_file(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--system", "gb300-nvl72", "--tp", "8", "--dcp", "8", "--ep", "8", "--json")
    assert code == 0
    doc = json.loads(out)
    group = doc["result"]["groups"][0]
    assert doc["result"]["model"]["mla_kv_bytes_per_token"] == 27_648
    assert doc["result"]["model"]["checkpoint_bytes"] == 1_559_965_606_912
    assert group["dcp"] == 8 and group["binding"] in ("mla-kv-pool", "kda-state-slots")
    assert group["logical_kv_tokens"] == group["kv_tokens_per_rank"] * 8
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    code, again, _ = run(capsys, "plan", str(saved), "--json")
    assert code == 0 and json.loads(again) == doc


def test_save_and_chart(capsys, tmp_path):
    chart, saved = tmp_path / "chart.png", tmp_path / "plan.yaml"
    code, _, _ = run(capsys, "plan", "--preset", "long-context", "--chart", str(chart), "--save", str(saved))
    assert code == 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, _ = run(capsys, "plan", str(saved))
    assert code == 0 and "unified TP16 DCP8 EP16" in out


def test_pd_groups_from_flags(capsys):
    code, out, _ = run(capsys, "plan", "--system", "gb300-nvl72", "--prefill", "tp=1,pp=8,replicas=2",
                       "--decode", "tp=8,dcp=8,ep=8,replicas=7", "--context-length", "100000")
    assert code == 0 and "prefill TP1 PP8" in out and "decode TP8 DCP8 EP8" in out


@pytest.mark.parametrize("argv, fragment", [
    (["--system", "dgx-9"], "system: unknown preset 'dgx-9'"),
    (["--system", "gb300-nvl72", "--tp", "-8"], "tp: must be >= 1"),
    (["--system", "gb300-nvl72", "--context-length", "-5"], "context_length: must be >= 1"),
    (["--system", "gb300-nvl72", "--kv-cache", "fp16"], "kv_cache: unknown value 'fp16'"),
    (["--system", "gb300-nvl72", "--kda-state", "fp64"], "kda_state: unknown value"),
    (["--system", "gb300-nvl72", "--tp", "8", "--dcp", "3"], "dcp-divides-attn-tp"),
    (["--system", "h200-8x", "--tp", "8"], "weights-fit"),
    (["--preset", "nope"], "preset: unknown plan preset"),
    (["--system", "gb300-nvl72", "--decode", "tp=8,colour=red"], "--decode: bad item 'colour=red'"),
    ([], "system: missing"),
])
def test_bad_input_exits_2_naming_the_field(capsys, argv, fragment):
    code, _, err = run(capsys, "plan", *argv)
    assert code == 2
    assert err.startswith("k3 plan: error:") and fragment in err, err


@pytest.mark.parametrize("yaml_text, fragment", [
    ("system: gb300-nvl72\ngroups: [{tp: 8}]\nworkload: {context_length: long}\n", "workload.context_length"),
    ("system: gb300-nvl72\ngroups: {tp: 8}\n", "groups: expected a non-empty list"),
    ("system: gb300-nvl72\ngroups: [{tp: 8}]\nprecision: fp8\n", "precision: expected a mapping"),
    ("system: {name: x, gpu_name: X, gpu_memory_gib: big, num_gpus: 8, gpus_per_node: 8, nvlink_domain_size: 8,"
     " network: infiniband, native_mxfp4: false}\ngroups: [{tp: 8}]\n", "system.gpu_memory_gib"),
    ("- just\n- a list\n", "plan: expected a mapping"),
    ("system: [unclosed\n", "not valid YAML"),
    ("system: gb300-nvl72\ngroups: [{tp: 8}]\nflavour: mild\n", "flavour: unknown top-level field"),
])
def test_yaml_type_errors_exit_2(capsys, tmp_path, yaml_text, fragment):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml_text)
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2 and fragment in err, err


def test_argparse_type_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--system", "gb300-nvl72", "--tp", "eight"])
    assert info.value.code == 2
    assert "--tp" in capsys.readouterr().err


@pytest.mark.skipif(not K3_SCRIPT.exists(), reason="console script not installed (pip install -e .)")
def test_console_script():
    proc = subprocess.run([str(K3_SCRIPT), "plan", "--system", "b300-8x", "--tp", "8", "--dcp", "8", "--ep", "8",
                           "--json"], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["groups"][0]["dcp"] == 8
    bad = subprocess.run([str(K3_SCRIPT), "plan", "--system", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "system" in bad.stderr
