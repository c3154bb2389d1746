"""The verify simulator: its sampler, the anchor's direction with a fixed seed, and a CLI smoke run."""
import numpy as np
import pytest

from k3_sglang.tooling.spec import sim


@pytest.fixture(scope="module")
def grid():
    """Every cost shape x K3 profile x N in {1, 4, 16, 64, 256}, 2 waves of requests (a few seconds)."""
    return sim.run_grid(sim.default_costs(), sim.k3_profiles(), sim.SLOTS, seed=3, waves=2, min_requests=16)


def _case(grid, cost, profile, n):
    return next(c for c in grid if (c.cost_name, c.profile, c.n_slots) == (cost, profile, n))


def test_profiles_match_k3_accept_lengths():
    prof = sim.k3_profiles()
    assert sim.accept_length(prof["chat"].qs[0], 7) == pytest.approx(2.7, abs=1e-9)
    assert sim.accept_length(prof["math"].qs[0], 7) == pytest.approx(5.0, abs=1e-9)
    assert 0.63 < prof["chat"].qs[0] < 0.65 and 0.85 < prof["math"].qs[0] < 0.87
    assert prof["mix"].weights == (0.3, 0.7)
    with pytest.raises(ValueError, match="accept length"):
        sim.q_for_accept_length(9.0)


def test_sampled_acceptance_matches_profile():
    """Verify-all at N=64 on chat commits about 2.7 tokens per request-step (the sampler is right)."""
    prof = sim.k3_profiles()["chat"]
    case = sim.run_case("cpu", sim.cpu_affine(), prof, 64, seed=1, waves=4)
    r = case.result("verify-all")
    per_request_step = r.tokens / (r.steps * 64)
    assert per_request_step == pytest.approx(2.7, rel=0.03)
    assert case.result("no-spec").tokens == case.result("no-spec").steps * 64


def test_anchor_direction(grid):
    for prof in ("chat", "math", "mix"):
        big = _case(grid, "gpu-staircase", prof, 256)
        assert big.tps("scheduled") >= 1.2 * big.tps("verify-all"), prof  # trimming gains at large batch
        for n in (1, 4):
            small = _case(grid, "gpu-staircase", prof, n)
            assert small.tps("scheduled") >= 0.99 * small.tps("verify-all"), (prof, n)  # break-even at batch 1-4
        cpu_big = _case(grid, "cpu-affine", prof, 256)
        assert cpu_big.tps("verify-all") < 0.9 * cpu_big.tps("no-spec"), prof  # verify-all loses on CPU at 256
        cpu_one = _case(grid, "cpu-affine", prof, 1)
        assert cpu_one.tps("scheduled") > 1.5 * cpu_one.tps("no-spec"), prof  # and speculation pays at batch 1
    for case in grid:
        key = (case.cost_name, case.profile, case.n_slots)
        assert case.tps("scheduled") >= 0.99 * case.tps("no-spec"), key


def test_seeded_and_deterministic():
    prof = sim.k3_profiles()["mix"]
    a = sim.run_case("stair", sim.gpu_staircase(), prof, 16, seed=5, waves=1)
    b = sim.run_case("stair", sim.gpu_staircase(), prof, 16, seed=5, waves=1)
    c = sim.run_case("stair", sim.gpu_staircase(), prof, 16, seed=6, waves=1)
    assert a == b and a != c


def test_simulate_arm_rejects_bad_input():
    q = np.full(4, 0.5)
    acc = np.zeros((4, 8), dtype=np.int64)
    with pytest.raises(ValueError, match="arm must be"):
        sim.simulate_arm("eagle", sim.cpu_affine(), q, acc, 2)
    with pytest.raises(ValueError, match="R >= n_slots"):
        sim.simulate_arm("scheduled", sim.cpu_affine(), q, acc, 8)


def test_cli_writes_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "sim.md"
    assert sim.main(["--out", str(out), "--slots", "1,16", "--waves", "1", "--min-requests", "4"]) == 0
    text = out.read_text()
    assert "| chat | 16 |" in text and "## cpu-affine" in text and "Date:" in text and "Machine:" in text
    png = tmp_path / "sim.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![tokens/s relative to no-spec](sim.png)" in text
    assert sim.main(["--out", "-", "--slots", "1", "--waves", "1", "--min-requests", "2"]) == 0
    assert "| math | 1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        sim.main(["--out", "-", "--slots", "0,x"])
    assert info.value.code == 2
