"""Step-cost models: the affine fit on noisy synthetic steps, JSON round trips, SGLang SPS tables, bad files."""
import json

import numpy as np
import pytest

from k3_sglang.spec.cost import (SCHEMA, AdditiveCost, AffineCost, StaircaseCost, load_cost, load_cost_with_meta,
                                 save_cost, step_seconds)
from k3_sglang.tooling.spec.cost_fit import StepSample, fit_affine, relative_residuals

TRUE = AffineCost(c0=0.012, c_req=0.0004, c_tok=0.00085, c_lmax=0.0021, d0=0.011, d_req=0.0009)


def _samples(model: AffineCost, rng: np.random.Generator, noise: float) -> list[StepSample]:
    out = []
    for n in (1, 2, 4, 8, 16, 32, 48, 64):
        for _ in range(3):
            lens = rng.integers(1, 9, size=n)  # ragged mixes separate T from L
            t, ell = int(lens.sum()), int(lens.max())
            secs = model.step(n, t, ell) * (1 + noise * rng.standard_normal())
            out.append(StepSample("verify", n, t, ell, secs))
        for ell in (1, 4, 8):  # uniform lengths
            secs = model.step(n, n * ell, ell) * (1 + noise * rng.standard_normal())
            out.append(StepSample("verify", n, n * ell, ell, secs))
        out.append(StepSample("decode", n, n, 1, model.decode(n) * (1 + noise * rng.standard_normal())))
    return out


def test_fit_recovers_coefficients_from_noisy_samples():
    rng = np.random.default_rng(7)
    fit = fit_affine(_samples(TRUE, rng, noise=0.01))
    for name in ("c0", "c_tok", "c_lmax", "d0", "d_req"):
        assert getattr(fit, name) == pytest.approx(getattr(TRUE, name), rel=0.15), name
    assert fit.c_req == pytest.approx(TRUE.c_req, abs=3e-4)
    res = relative_residuals(fit, _samples(TRUE, np.random.default_rng(8), noise=0.0))
    assert np.all(np.isfinite(res)) and np.max(np.abs(res)) < 0.05


def test_fit_exact_without_noise():
    fit = fit_affine(_samples(TRUE, np.random.default_rng(1), noise=0.0))
    got = np.array([fit.c0, fit.c_req, fit.c_tok, fit.c_lmax, fit.d0, fit.d_req])
    want = np.array([TRUE.c0, TRUE.c_req, TRUE.c_tok, TRUE.c_lmax, TRUE.d0, TRUE.d_req])
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-9


def test_fit_clamps_a_negative_coefficient_to_zero():
    # seconds fall with l_max at fixed T: unconstrained least squares gives c_lmax < 0, the fit clamps it and
    # refits the others
    rng = np.random.default_rng(3)
    samples = []
    for n in (1, 2, 4, 8, 16):
        for ell in (1, 2, 4, 8):
            for t in (n * 8, n * 8 + 5):
                samples.append(StepSample("verify", n, t, ell, 0.01 + 0.001 * t - 0.0005 * ell +
                                          0.0001 * rng.random()))
        samples.append(StepSample("decode", n, n, 1, 0.01 + 0.001 * n))
    rows = np.array([[1, s.n_reqs, s.n_tokens, s.l_max] for s in samples if s.kind == "verify"], float)
    secs = np.array([s.seconds for s in samples if s.kind == "verify"])
    unconstrained = np.linalg.lstsq(rows, secs, rcond=None)[0]
    assert unconstrained[3] < 0
    fit = fit_affine(samples)
    assert fit.c_lmax == 0.0
    assert min(fit.c0, fit.c_req, fit.c_tok) >= 0.0
    assert fit.c_tok == pytest.approx(0.001, rel=0.2)


def test_fit_without_lmax_term():
    fit = fit_affine(_samples(TRUE, np.random.default_rng(2), noise=0.0), fit_lmax=False)
    assert fit.c_lmax == 0.0 and fit.c_tok > 0


def test_fit_errors_are_clear():
    good = _samples(TRUE, np.random.default_rng(4), noise=0.0)
    with pytest.raises(ValueError, match="verify samples, need at least 4"):
        fit_affine([s for s in good if s.kind == "decode"] + [s for s in good if s.kind == "verify"][:3])
    with pytest.raises(ValueError, match="0 decode samples"):
        fit_affine([s for s in good if s.kind == "verify"])
    same_shape = [StepSample("verify", 4, 16, 4, 0.02 + 0.001 * i) for i in range(6)]
    with pytest.raises(ValueError, match="degenerate"):
        fit_affine(same_shape + [s for s in good if s.kind == "decode"])
    one_n = [StepSample("decode", 8, 8, 1, 0.02), StepSample("decode", 8, 8, 1, 0.021)]
    with pytest.raises(ValueError, match="decode samples are degenerate"):
        fit_affine([s for s in good if s.kind == "verify"] + one_n)
    with pytest.raises(ValueError, match="kind"):
        StepSample("prefill", 1, 1, 1, 0.1)
    with pytest.raises(ValueError, match="n_tokens >= n_reqs"):
        StepSample("verify", 4, 3, 1, 0.1)
    with pytest.raises(ValueError, match="seconds"):
        StepSample("verify", 4, 4, 1, float("nan"))


def test_models_validate_and_vectorise():
    with pytest.raises(ValueError, match="c_tok"):
        AffineCost(0.01, 0, -1e-3, 0, 0.01, 0)
    with pytest.raises(ValueError, match="strictly increasing"):
        StaircaseCost((8, 4, 16), (1.0, 1.0, 2.0))
    with pytest.raises(ValueError, match="strictly increasing"):
        StaircaseCost((4, 4), (1.0, 1.0))
    with pytest.raises(ValueError, match="must not decrease"):
        StaircaseCost((4, 8), (2.0, 1.0))
    with pytest.raises(ValueError, match="differ in length"):
        StaircaseCost((4, 8), (1.0,))
    with pytest.raises(ValueError, match="n_tokens must be >= n_reqs"):
        TRUE.step(4, 3, 1)
    stair = StaircaseCost((8, 16, 32), (1.0, 2.0, 3.0))
    assert [stair.step(1, t, 1) for t in (1, 8, 9, 16, 17, 32)] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert stair.step(1, 33, 1) == float("inf")
    with pytest.raises(ValueError, match="beyond the staircase"):
        stair.decode(33)
    assert stair.decode(9) == 2.0
    t = np.arange(4, 40)
    ell = np.minimum(8, t // 4)
    for model in (TRUE, stair):
        loop = np.array([model.step(4, int(a), int(b)) for a, b in zip(t, ell)])
        np.testing.assert_array_equal(step_seconds(model, 4, t, ell), loop)


def test_save_load_round_trip(tmp_path):
    add = AdditiveCost(0.01, (1, 64), (0.0, 0.02), (1, 512), (0.0, 0.3))
    for model in (TRUE, StaircaseCost((8, 16, 64), (0.01, 0.012, 0.03)), add):
        path = tmp_path / f"{type(model).__name__}.json"
        save_cost(model, path, {"machine": "test", "n": 3})
        doc = json.loads(path.read_text())
        assert doc["schema"] == SCHEMA and doc["meta"] == {"machine": "test", "n": 3}
        back, meta = load_cost_with_meta(path)
        assert back == model and meta == {"machine": "test", "n": 3}
        assert load_cost(path) == model


def _sgl_sps():
    from sglang.srt.speculative.dspark_components import dspark_sps  # a hard import: a moved module fails, not skips

    return dspark_sps


def test_sglang_sps_tables_load(tmp_path):
    sps = _sgl_sps()
    probes = list(range(1, 65))
    rate = [1.0 / (0.02 + 0.01 * (t // 16)) for t in probes]
    dense = sps.SpsCostTable(sample_batch_tokens=probes, sample_steps_per_sec=rate, max_batch_tokens=64)
    path = tmp_path / "dense.json"
    path.write_text(dense.to_json())
    model, meta = load_cost_with_meta(path)
    assert isinstance(model, StaircaseCost) and meta["source"] == "sglang-sps"
    for t in range(1, 65):  # SGLang's floor lookup and ours agree at every token count of a dense table
        assert model.step(1, t, 1) == pytest.approx(1.0 / dense.lookup(t), rel=1e-12)

    additive = sps.SpsAdditiveCostTable(bias_seconds=0.01, bs_probes=[1, 8, 64], alpha_seconds=[0.0, 0.002, 0.01],
                                        m_probes=[1, 64, 512], theta_seconds=[0.0, 0.01, 0.2])
    path = tmp_path / "additive.json"
    path.write_text(additive.to_json())
    model = load_cost(path)
    assert isinstance(model, AdditiveCost)
    for n in (1, 5, 64, 100):
        for budget in (0, 3, 70, 600):
            assert model.step(n, n + budget, 1) == pytest.approx(additive.step_time(num_reqs=n, budget=budget),
                                                                 rel=1e-12)

    sparse = sps.SpsCostTable(sample_batch_tokens=[1, 64, 256], sample_steps_per_sec=[50.0, 40.0, 20.0],
                              max_batch_tokens=256)
    path = tmp_path / "sparse.json"
    path.write_text(sparse.to_json())
    with pytest.raises(ValueError, match=r"sparse.json: SPS table is sparse \(probes jump 1 -> 64\)"):
        load_cost(path)
    short = sps.SpsCostTable(sample_batch_tokens=[1, 2, 3], sample_steps_per_sec=[5.0, 4.0, 3.0],
                             max_batch_tokens=64)
    path.write_text(short.to_json())
    with pytest.raises(ValueError, match="max_batch_tokens 64 > last probe 3"):
        load_cost(path)
    path.write_text(sps.build_uninitialized_sps_table(max_batch_tokens=64).to_json())
    with pytest.raises(ValueError, match="single probe"):
        load_cost(path)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"foo": 1}', "not a cost file"),
    ('{"schema": "k3-verify-cost/v0", "kind": "affine"}', "unknown schema"),
    (json.dumps({"schema": SCHEMA, "kind": "cubic"}), "unknown cost kind 'cubic'"),
    (json.dumps({"schema": SCHEMA, "kind": "affine", "c0": 0.01}), "missing field"),
    (json.dumps({"schema": SCHEMA, "kind": "affine", "c0": "fast", "c_req": 0, "c_tok": 0, "c_lmax": 0,
                 "d0": 0.01, "d_req": 0}), "'c0' must be a number"),
    (json.dumps({"schema": SCHEMA, "kind": "staircase", "edges": [16, 8], "seconds": [1, 2]}),
     "strictly increasing"),
    (json.dumps({"schema": SCHEMA, "kind": "staircase", "edges": [1.5], "seconds": [1]}), "list of integers"),
    (json.dumps({"schema": SCHEMA, "kind": "affine", "c0": 0.01, "c_req": 0, "c_tok": 0, "c_lmax": 0,
                 "d0": 0.01, "d_req": 0, "meta": 3}), "'meta' must be an object"),
    ('{"sample_batch_tokens": [2, 1], "sample_steps_per_sec": [1, 1], "max_batch_tokens": 2}',
     "strictly increasing"),
    ('{"bias_seconds": 0, "bs_probes": [1], "alpha_seconds": [0], "m_probes": [1], "theta_seconds": [0]}',
     "bias_seconds must be > 0"),
])
def test_bad_files_name_file_and_problem(tmp_path, text, message):
    path = tmp_path / "cost.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_cost(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read cost file"):
        load_cost(tmp_path / "absent.json")
