"""The verify planner: exhaustive reference, budget-0 floor, staircase edges, decode fallback, caps, prefixes,
determinism, hysteresis, the affine threshold rule, and a cross-check against SGLang's DSpark budget."""
import itertools

import numpy as np
import pytest

from k3_sglang.spec.cost import AdditiveCost, AffineCost, StaircaseCost, load_cost
from k3_sglang.spec.planner import Decision, Planner, PlannerConfig, plan_step, survival_from_confidence

CPU = AffineCost(c0=0.013, c_req=0.0, c_tok=0.00087, c_lmax=0.0, d0=0.013, d_req=0.00087)
CPU_L = AffineCost(c0=0.013, c_req=0.0002, c_tok=0.0006, c_lmax=0.004, d0=0.013, d_req=0.00087)
EDGES = tuple(range(8, 257, 8))
STAIR = StaircaseCost(EDGES, tuple(0.02 * (1 + e // 64) for e in EDGES))


def _random_survival(rng, n, g, zero_frac=0.1):
    conf = rng.uniform(0.2, 1.0, size=(n, g))
    conf[rng.random((n, g)) < zero_frac] = 0.0
    return survival_from_confidence(conf)


def _theta(s, lens, cost):
    n = s.shape[0]
    committed = n + sum(float(s[i, : v - 1].sum()) for i, v in enumerate(lens))
    return committed / cost.step(n, int(sum(lens)), int(max(lens)))


def _check_consistent(d: Decision, caps):
    n = len(caps)
    assert len(d.verify_lens) == n
    assert all(1 <= v <= c for v, c in zip(d.verify_lens, caps))
    assert d.budget == sum(d.verify_lens) - n
    if d.mode == "decode":
        assert d.verify_lens == (1,) * n and d.budget == 0


@pytest.mark.parametrize("cost", [CPU, CPU_L, STAIR], ids=["affine", "affine-lmax", "staircase"])
def test_compact_matches_exhaustive_search(cost):
    rng = np.random.default_rng(11)
    for _ in range(60):
        n, g = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        s = _random_survival(rng, n, g, zero_frac=0.2)
        caps = rng.integers(1, g + 2, size=n)
        d = plan_step(s, caps, cost, "compact", PlannerConfig(margin=0.0))
        _check_consistent(d, caps)
        best = max(_theta(s, lens, cost) for lens in itertools.product(*[range(1, c + 1) for c in caps])
                   if all(v == 1 or s[i, v - 2] >= 1e-6 for i, v in enumerate(lens)))
        assert d.verify_tps == pytest.approx(best, rel=1e-12)
        if d.mode == "verify":
            assert _theta(s, d.verify_lens, cost) == pytest.approx(d.modelled_tps, rel=1e-12)


@pytest.mark.parametrize("cost", [CPU, CPU_L, STAIR], ids=["affine", "affine-lmax", "staircase"])
def test_never_below_budget_zero_nor_decode(cost):
    rng = np.random.default_rng(5)
    for _ in range(100):
        n, g = int(rng.integers(1, 33)), int(rng.integers(1, 8))
        s = _random_survival(rng, n, g)
        caps = rng.integers(1, g + 2, size=n)
        d = plan_step(s, caps, cost, "compact")
        _check_consistent(d, caps)
        theta0 = n / cost.step(n, n, 1)
        assert d.verify_tps >= theta0 * (1 - 1e-12)
        assert d.modelled_tps >= d.decode_tps * (1 - 1e-12)
        if d.mode == "verify":
            assert d.modelled_tps >= d.decode_tps * 1.01 and d.budget > 0


def test_staircase_budget_lands_on_a_step_edge():
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(50):
        n = int(rng.integers(1, 25))
        s = survival_from_confidence(rng.uniform(0.3, 0.99, size=(n, 7)))
        d = plan_step(s, np.full(n, 8), STAIR, "compact")
        if d.mode == "decode":
            continue
        total = n + d.budget
        assert total in EDGES or d.budget == 7 * n, (n, total)  # top of a step, unless every draft is verified
        hits += total in EDGES
    assert hits >= 10


def test_zero_confidence_gives_plain_decoding():
    for cost in (CPU, CPU_L, STAIR):
        for n in (1, 7, 64):
            for s in (np.zeros((n, 7)), np.full((n, 7), 1e-7)):
                d = plan_step(s, np.full(n, 8), cost, "compact")
                assert d.mode == "decode" and d.budget == 0 and d.verify_lens == (1,) * n
                assert d.modelled_tps == d.decode_tps == pytest.approx(n / cost.decode(n))
                assert Planner(cost).plan(s, np.full(n, 8)).mode == "decode"


def test_cells_below_survival_eps_are_never_chosen():
    flat = StaircaseCost((16,), (0.02,))  # every chain up to 16 tokens costs the same: below-eps cells look free
    s = np.array([[0.5, 5e-7, 5e-7, 0.0], [0.9, 0.8, 2e-6, 1e-6]])
    d = plan_step(s, np.array([5, 5]), flat, "compact", PlannerConfig(margin=0.0))
    assert d.verify_lens == (2, 5)
    d = plan_step(s, np.array([5, 5]), flat, "compact", PlannerConfig(margin=0.0, survival_eps=1e-5))
    assert d.verify_lens == (2, 3)
    assert plan_step(s, np.array([5, 5]), flat, "static").verify_lens == (5, 5)  # verify-all ignores eps


def test_caps_respected_and_static_verifies_caps():
    rng = np.random.default_rng(9)
    s = np.ones((6, 7))
    caps = np.array([1, 2, 8, 3, 1, 5])
    d = plan_step(s, caps, CPU, "compact")
    assert d.mode == "verify" and d.verify_lens == tuple(caps)  # everything survives: verify up to each cap
    st = plan_step(_random_survival(rng, 6, 7), caps, CPU, "static")
    assert st.mode == "verify" and st.verify_lens == tuple(caps) and st.budget == int(caps.sum()) - 6
    assert type(st.modelled_tps) is float and type(st.decode_tps) is float and type(d.modelled_tps) is float
    assert plan_step(s, np.ones(6, int), CPU, "static").mode == "decode"
    assert plan_step(s, np.ones(6, int), CPU, "compact").mode == "decode"
    assert plan_step(s, caps, CPU, "decode").mode == "decode"


def test_lengths_are_prefixes_in_sglang_tie_order():
    # equal survival everywhere: ties go to the lower position, then the lower request
    s = np.full((2, 3), 0.5)
    stair = StaircaseCost((2, 5, 8), (1.0, 1.0, 10.0))  # 5 tokens cost as much as 2: budget 3
    d = plan_step(s, np.array([4, 4]), stair, "compact")
    assert d.verify_lens == (3, 2)
    rng = np.random.default_rng(4)
    for _ in range(50):
        n, g = int(rng.integers(1, 20)), 7
        s = _random_survival(rng, n, g)
        caps = rng.integers(1, g + 2, size=n)
        d = plan_step(s, caps, CPU, "compact", PlannerConfig(margin=0.0))
        if d.mode == "decode":
            continue
        chosen = [s[i, j] for i, v in enumerate(d.verify_lens) for j in range(v - 1)]
        unchosen = [s[i, j] for i, v in enumerate(d.verify_lens) for j in range(v - 1, caps[i] - 1)]
        assert min(chosen) >= max(unchosen, default=0.0)  # the chosen prefixes are the top cells


def test_min_verify_len_floor():
    d = plan_step(np.zeros((3, 4)), np.array([1, 2, 5]), AffineCost(0.01, 0, 0.001, 0, 1.0, 0),
                  "compact", PlannerConfig(min_verify_len=3))
    assert d.mode == "verify" and d.verify_lens == (1, 2, 3)


def test_deterministic_for_identical_inputs():
    rng = np.random.default_rng(6)
    inputs = [(_random_survival(rng, n, 7), rng.integers(1, 9, size=n)) for n in (1, 5, 33, 64, 5, 1)]
    runs = []
    for _ in range(2):
        planner = Planner(CPU_L)
        runs.append([planner.plan(s.copy(), c.copy()) for s, c in inputs])
    assert runs[0] == runs[1]
    assert [plan_step(s, c, STAIR, "compact") for s, c in inputs] == \
           [plan_step(s, c, STAIR, "compact") for s, c in inputs]


def test_hysteresis():
    cost = AffineCost(c0=0.02, c_req=0.0, c_tok=0.001, c_lmax=0.0, d0=0.013, d_req=0.001)
    n = 4
    good = np.tile(0.95 ** np.arange(1, 8), (n, 1))
    weak = np.tile(0.4 ** np.arange(1, 8), (n, 1))
    caps = np.full(n, 8)
    assert plan_step(good, caps, cost, "compact").mode == "verify"
    weak_d = plan_step(weak, caps, cost, "compact")
    assert weak_d.mode == "decode" and 0 < weak_d.verify_tps < weak_d.decode_tps * 1.01
    planner = Planner(cost, "compact", PlannerConfig(hysteresis_steps=2))
    seq = [good, weak, weak, good, weak, good, good, weak]
    modes = [planner.plan(s, caps).mode for s in seq]
    assert modes == ["verify", "verify", "decode", "decode", "decode", "decode", "verify", "verify"]
    held = Planner(cost)
    held.plan(good, caps)
    d = held.plan(weak, caps)  # held in verify: the best verify plan, not a 1-token verify
    assert d.mode == "verify" and d.budget > 0 and d.modelled_tps == pytest.approx(weak_d.verify_tps)
    assert held.plan(np.zeros((n, 7)), caps).mode == "decode"  # nothing to verify: decode this step ...
    assert held.state == "verify" and held.plan(good, caps).mode == "verify"  # ... without a mode switch
    assert held.plan(weak, caps).mode == "verify" and held.plan(weak, caps).mode == "decode"
    assert held.plan(np.ones((n, 7)), np.ones(n, int)).mode == "decode" and held.state == "decode"
    instant = Planner(cost, "compact", PlannerConfig(hysteresis_steps=1))
    assert [instant.plan(s, caps).mode for s in seq] == ["verify", "decode", "decode", "verify", "decode",
                                                         "verify", "verify", "decode"]


def test_affine_cost_threshold_rule_and_large_batch_decode():
    q = np.array([0.64, 0.86])
    budgets = []
    for n in (1, 4, 16, 64, 256):
        s = (q[np.arange(n) % 2][:, None]) ** np.arange(1, 8)[None, :]
        d = plan_step(s, np.full(n, 8), CPU, "compact", PlannerConfig(margin=0.0))
        budgets.append(d.budget)
        if d.mode == "verify":  # verify a cell iff its survival beats c_tok x theta*
            chosen = [s[i, j] for i, v in enumerate(d.verify_lens) for j in range(v - 1)]
            unchosen = [s[i, j] for i, v in enumerate(d.verify_lens) for j in range(v - 1, 7)]
            bar = CPU.c_tok * d.modelled_tps
            assert min(chosen) >= bar * (1 - 1e-9) and max(unchosen, default=0.0) <= bar * (1 + 1e-9)
    assert budgets[0] >= 4 and budgets[-1] == 0  # N=1: a 5-token chain; N=256: 0 -> decode
    per_request = [b / n for b, n in zip(budgets, (1, 4, 16, 64, 256))]
    assert all(a >= b for a, b in zip(per_request, per_request[1:]))


def test_bad_inputs_raise_clear_errors():
    s = np.full((2, 3), 0.5)
    with pytest.raises(ValueError, match="mode"):
        plan_step(s, np.array([4, 4]), CPU, "eager")
    with pytest.raises(ValueError, match="caps must have shape"):
        plan_step(s, np.array([4]), CPU, "compact")
    with pytest.raises(ValueError, match=r"caps must lie in 1..G\+1=4"):
        plan_step(s, np.array([5, 1]), CPU, "compact")
    with pytest.raises(ValueError, match="non-increasing"):
        plan_step(np.array([[0.2, 0.5, 0.1]]), np.array([4]), CPU, "compact")
    with pytest.raises(ValueError, match="NaN"):
        plan_step(np.array([[np.nan, 0.5, 0.1]]), np.array([4]), CPU, "compact")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        plan_step(np.array([[1.5, 0.5, 0.1]]), np.array([4]), CPU, "compact")
    with pytest.raises(ValueError, match="2-D"):
        plan_step(np.array([0.5]), np.array([2]), CPU, "compact")
    with pytest.raises(ValueError, match="integers"):
        plan_step(s, np.array([1.5, 2.0]), CPU, "compact")
    with pytest.raises(ValueError, match="hysteresis_steps"):
        PlannerConfig(hysteresis_steps=0)


# ---- cross-check against SGLang 0.5.23's DSpark budget (srt/speculative/dspark_components/dspark_planner.py) ----

def test_budget_equals_sglang_compute_verify_token_budget(tmp_path):
    """compute_verify_token_budget(history_survival_probs [N, gamma], table, cfg) takes every cell (max_verify_len
    = gamma+1 covers the gamma drafts), drops cells < survival_eps and maximises (N + top-k) / step(N + k). Ours
    with c_lmax = 0, caps = gamma+1 and min_verify_len = 1 must give the same k. SGLang has no affine table: the
    affine cost maps exactly onto an SpsAdditiveCostTable (linear alpha and theta between two probes), and a
    dense SpsCostTable onto a StaircaseCost. Decoding is priced high so our never-slower rule does not hide k."""
    import torch
    # hard imports of SGLang 0.5.23's DSpark modules: a moved module fails here instead of skipping
    from sglang.kernels.ops.speculative.dspark import dspark_schedule as sched
    from sglang.srt.speculative.dspark_components import dspark_planner as dp
    from sglang.srt.speculative.dspark_components import dspark_sps as sps

    rng = np.random.default_rng(1234)
    nmax, tmax = 512, 1 << 14
    dense_probes = list(range(1, 2049))
    dense_secs = [0.01 * (1 + t // 64) + 1e-6 * t for t in dense_probes]
    dense = sps.SpsCostTable(sample_batch_tokens=dense_probes, sample_steps_per_sec=[1 / x for x in dense_secs],
                             max_batch_tokens=2048)
    dense_path = tmp_path / "dense.json"
    dense_path.write_text(dense.to_json())
    ours_stair = load_cost(dense_path)
    nonzero = 0
    for trial in range(120):
        n, gamma = int(rng.integers(1, 129)), int(rng.integers(1, 8))
        s = _random_survival(rng, n, gamma, zero_frac=0.05)
        c0, c_req, c_tok = rng.uniform(0.005, 0.03), rng.uniform(0, 1e-3), rng.uniform(1e-5, 2e-3)
        affine = AffineCost(c0=c0, c_req=c_req, c_tok=c_tok, c_lmax=0.0, d0=100.0, d_req=0.0)
        table = sps.SpsAdditiveCostTable(bias_seconds=c0, bs_probes=[1, nmax], alpha_seconds=[c_req, c_req * nmax],
                                         m_probes=[1, tmax], theta_seconds=[c_tok, c_tok * tmax])
        cfg = dp.DSparkScheduleConfig(gamma=gamma)
        want = dp.compute_verify_token_budget(history_survival_probs=torch.from_numpy(s), sps_table=table, cfg=cfg)
        got = plan_step(s, np.full(n, gamma + 1), affine, "compact")
        assert got.budget == want.budget, (trial, n, gamma)
        if got.budget:
            assert got.modelled_tps == pytest.approx(want.predicted_theta, rel=1e-9)
        nonzero += got.budget > 0
        additive = AdditiveCost(c0, (1, nmax), (c_req, c_req * nmax), (1, tmax), (c_tok, c_tok * tmax))
        assert plan_step(s, np.full(n, gamma + 1), _pricey_decode(additive), "compact").budget == want.budget
        if n * (gamma + 1) <= 2048:
            want_s = dp.compute_verify_token_budget(history_survival_probs=torch.from_numpy(s), sps_table=dense,
                                                    cfg=cfg)
            got_s = plan_step(s, np.full(n, gamma + 1), _pricey_decode(ours_stair), "compact")
            assert got_s.budget == want_s.budget, (trial, n, gamma)
            lens = sched.schedule_verify_lens_topk_from_survival(survival_probs=torch.from_numpy(s),
                                                              budget=want_s.budget, cfg=cfg)
            assert tuple(int(v) for v in lens) == got_s.verify_lens  # same allocation too
    assert nonzero >= 60


class _pricey_decode:
    """A cost wrapper whose decode step is very slow, so plan_step never falls back to decode."""

    def __init__(self, inner):
        self.inner = inner

    def step(self, n_reqs, n_tokens, l_max):
        return self.inner.step(n_reqs, n_tokens, l_max)

    def step_many(self, n_reqs, n_tokens, l_max):
        return self.inner.step_many(n_reqs, n_tokens, l_max)

    def decode(self, n_reqs):
        return 100.0
