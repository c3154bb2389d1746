"""`k3 bench long-context`'s arithmetic and report, on made-up points (the bench itself needs a server)."""
import argparse

import pytest

from k3_sglang.tooling.bench.long_context import Point, fit_linear_quadratic, scaling_ratio
from k3_sglang.tooling.bench.long_context_report import write_report


def _points(a: float, b: float) -> list[Point]:
    return [Point(n, a * n + b * n * n, 20.0, (a * n + b * n * n,)) for n in (4096, 16384, 65536)]


def test_fit_recovers_the_linear_and_quadratic_terms_and_the_ratio():
    points = _points(5e-4, 1e-8)
    a, b = fit_linear_quadratic(points)
    assert a == pytest.approx(5e-4) and b == pytest.approx(1e-8)
    want = (5e-4 * 65536 + 1e-8 * 65536 ** 2) / (5e-4 * 16384 + 1e-8 * 16384 ** 2)
    assert scaling_ratio(points) == pytest.approx(want)
    assert scaling_ratio(points[:1]) is None  # 16K and 64K both needed


def test_report_states_the_goal_and_names_no_retired_switch(tmp_path):
    import datetime

    args = argparse.Namespace(lengths=[4096, 16384, 65536], decode_tokens=32, repeats=1, chunked_prefill_size=None,
                              serve_args=[], out=tmp_path / "lc.md")
    points = _points(5e-4, 1e-8)
    write_report(args, datetime.datetime(2026, 12, 7, tzinfo=datetime.timezone.utc), points, scaling_ratio(points),
                 {25_000: 0.3, 100_000: 1.3})
    text = args.out.read_text()
    assert f"**{scaling_ratio(points):.2f}x** (goal <= 5x: not met)" in text and "| 65,536 |" in text
    assert "K3_MLA_EXTEND" not in text and "torch_native" not in text
    assert (tmp_path / "lc.png").stat().st_size > 0
    args.out.write_text(text + "\n## History\n\nan earlier run\n")
    write_report(args, datetime.datetime(2026, 12, 8, tzinfo=datetime.timezone.utc), points, 4.0, {25_000: 0.3,
                                                                                                  100_000: 1.3})
    again = args.out.read_text()
    assert "2026-12-08" in again and again.endswith("\n## History\n\nan earlier run\n")
