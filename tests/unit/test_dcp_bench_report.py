"""`k3 bench dcp`'s tables from measured cells (pure): medians, the read ratio by the busiest rank, capacity."""
from __future__ import annotations

from k3_sglang.tooling.bench.dcp import Cell
from k3_sglang.tooling.bench.dcp_report import summarize


def test_summary_reports_step_and_read_ratios_and_capacity():
    cells = {("dcp1", 1000): Cell([10.0, 30.0, 20.0], [[1000, 1000]] * 3),
             ("dcp2", 1000): Cell([12.0, 11.0, 13.0], [[500, 499]] * 3)}
    text = summarize(cells, [1000], {"dcp1": 100, "dcp2": 200})
    row = next(line for line in text.splitlines() if line.startswith("| 1000 |"))
    assert "| 20.0 | 12.0 | 0.60 |" in row
    assert "| 1000 / 1000 | 500 / 499 | 0.500 |" in row
    assert "| dcp2 | 200 | 2.00x |" in text


def test_bench_dcp_bad_input_exits_2_before_starting_servers(capsys):
    from k3_sglang.cli import main

    assert main(["bench", "dcp", "--contexts", "10", "--out", "-"]) == 2
    assert "--contexts must be >= 64" in capsys.readouterr().err
    assert main(["bench", "dcp", "--contexts", "200000", "--out", "-"]) == 2
    assert "--pool-tokens 131072 must hold the longest context" in capsys.readouterr().err


def test_report_has_one_section_per_model(tmp_path):
    import argparse
    import datetime

    from k3_sglang.tooling.bench.dcp_report import write_report

    args = argparse.Namespace(model_impl="both", contexts=[1000], decode_tokens=8, repeats=1, pool_tokens=4096)
    out = tmp_path / "bench-dcp.md"
    write_report(out, datetime.datetime(2026, 12, 6), args, {"portable": "| portable table |",
                                                             "sglang": "| sglang table |"})
    text = out.read_text()
    assert "--model-impl both" in text
    assert text.index("## The portable model") < text.index("| portable table |") < text.index("## SGLang's own K3") \
        < text.index("| sglang table |")
