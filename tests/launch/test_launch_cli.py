"""`k3 launch render` end to end through k3_sglang.cli.main."""

from __future__ import annotations

from k3_sglang.cli import main
from k3_sglang.launch.golden import EXAMPLES_DIR


def test_render_from_a_plan_file_matches_the_example(tmp_path, capsys):
    plan = EXAMPLES_DIR / "long-context" / "plan.yaml"
    assert main(["launch", "render", str(plan), "--out", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out
    for name in ("plan.yaml", "k3-long-context.sh"):
        assert (tmp_path / name).read_text() == (EXAMPLES_DIR / "long-context" / name).read_text()


def test_render_from_flags_with_pd_on_a_rack(tmp_path, capsys):
    code = main(["launch", "render", "--system", "gb200-nvl72", "--prefill", "tp=1,pp=16", "--decode",
                 "tp=16,dcp=16,ep=16,replicas=2", "--model-path", "/lustre/k3", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    sbatch = next(tmp_path.glob("*.sbatch")).read_text()
    assert "--dcp-size 16" in sbatch and 'MODEL_PATH="${MODEL_PATH:-/lustre/k3}"' in sbatch
    assert "model_path: /lustre/k3" in (tmp_path / "plan.yaml").read_text()


def test_dry_run_prints_commands_and_writes_nothing(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert main(["launch", "render", "--preset", "agent-100k", "--out", str(out_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would write" in out and "k3 serve" in out and "ROUTER=(k3 router" in out
    assert not out_dir.exists()


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["launch", "render", "--system", "nope", "--out", str(tmp_path)]) == 2
    assert "system: unknown preset" in capsys.readouterr().err
    bad = tmp_path / "plan.yaml"
    bad.write_text("system: gb300-nvl72\ngroups: [{tp: 8}]\nlaunch: {router_port: many}\n")
    assert main(["launch", "render", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "launch.router_port" in capsys.readouterr().err
    assert main(["launch", "render", "--system", "h200-8x", "--out", str(tmp_path)]) == 2
    assert "weights-fit" in capsys.readouterr().err
    assert main(["launch"]) == 2
