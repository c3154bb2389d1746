"""Beta-bucket calibrator: convergence, unbiased under censoring, forgetting, ECE, save/load."""
import json

import numpy as np
import pytest

from k3_sglang.spec.drafters.calibrate import BetaBucketCalibrator, CalibratorConfig, expected_calibration_error


def _blocks(cal, rng, q, n_blocks, gamma, verify_len, buckets=None):
    """Feed blocks whose drafts are accepted i.i.d. with prob q[j]; the first verify_len(...) are verified."""
    buckets = buckets or [(j,) for j in range(gamma)]
    for _ in range(n_blocks):
        acc = rng.random(gamma) < q
        first_reject = int(np.argmin(acc)) if not acc.all() else gamma
        nv = verify_len(rng)
        na = min(first_reject, nv)
        cal.update(buckets, nv, na, predicted=[cal.estimate(b) for b in buckets])


def test_converges_to_true_conditional_rates():
    rng = np.random.default_rng(0)
    q = np.array([0.9, 0.7, 0.5, 0.3])
    cal = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    _blocks(cal, rng, q, 6000, 4, lambda r: 4)
    est = cal.estimate_many([(j,) for j in range(4)])
    assert np.abs(est - q).max() < 0.03, est


def test_censoring_does_not_bias_the_conditional_estimate():
    rng = np.random.default_rng(1)
    q = np.array([0.8, 0.6, 0.6])
    cal = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    # random trimming: verify 0..3 drafts per block, independent of the outcome
    _blocks(cal, rng, q, 20000, 3, lambda r: int(r.integers(0, 4)))
    est = cal.estimate_many([(j,) for j in range(3)])
    assert np.abs(est - q).max() < 0.03, est
    # a naive estimator that counts censored positions as failures would be far off
    s, f = cal.counts((2,))
    assert s + f < 20000 * 0.6


def test_update_counts_and_validation():
    cal = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    assert cal.update([(0,), (1,), (2,)], 3, 1) == 2
    assert cal.counts((0,)) == (1.0, 0.0) and cal.counts((1,)) == (0.0, 1.0) and cal.counts((2,)) == (0.0, 0.0)
    assert cal.update([(0,), (1,)], 2, 2) == 2  # all accepted: no failure
    assert cal.update([(0,)], 0, 0) == 0
    with pytest.raises(ValueError):
        cal.update([(0,)], 1, 2)
    with pytest.raises(ValueError):
        cal.update([(0,)], 2, 0)
    with pytest.raises(ValueError, match="forgetting"):
        CalibratorConfig(forgetting=0.0)


def test_forgetting_tracks_a_change():
    rng = np.random.default_rng(2)
    slow = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    fast = BetaBucketCalibrator(CalibratorConfig(forgetting=0.995))
    for cal in (slow, fast):
        r = np.random.default_rng(3)
        for q in (0.9, 0.2):
            for _ in range(3000):
                ok = bool(r.random() < q)
                cal.update([(0,)], 1, int(ok))
    assert abs(fast.estimate((0,)) - 0.2) < 0.08
    assert slow.estimate((0,)) > 0.45  # no forgetting: stuck near the average
    del rng


def test_optimism_bonus_decays_with_data():
    cal = BetaBucketCalibrator(CalibratorConfig(bonus=0.2, forgetting=1.0))
    assert cal.estimate((5,)) == pytest.approx(0.7)
    for _ in range(400):
        cal.update([(5,)], 1, 0)
    assert cal.estimate((5,)) < 0.02


def test_ece_small_when_calibrated_large_when_not():
    rng = np.random.default_rng(4)
    p = rng.random(50000)
    y = (rng.random(50000) < p).astype(float)
    assert expected_calibration_error(p, y) < 0.02
    assert expected_calibration_error(np.clip(p + 0.3, 0, 1), y) > 0.2
    cal = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    _blocks(cal, rng, np.array([0.9, 0.6]), 5000, 2, lambda r: 2)
    assert cal.ece() < 0.03
    rel = cal.reliability()
    assert len(rel) == 10 and sum(b["count"] for b in rel) > 5000


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(5)
    cal = BetaBucketCalibrator(CalibratorConfig(a0=2.0, b0=0.5, forgetting=0.99, bonus=0.01))
    buckets = [(j, 2, 1, 0) for j in range(5)]
    _blocks(cal, rng, np.array([0.9, 0.8, 0.7, 0.6, 0.5]), 300, 5, lambda r: int(r.integers(0, 6)), buckets)
    path = tmp_path / "prior.json"
    cal.save(str(path))
    back = BetaBucketCalibrator.load(str(path))
    assert back.config == cal.config
    np.testing.assert_allclose(back.estimate_many(buckets), cal.estimate_many(buckets), rtol=0, atol=1e-12)
    assert back.estimate((9, 9, 9, 9)) == cal.estimate((9, 9, 9, 9))


def test_load_bad_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        BetaBucketCalibrator.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        BetaBucketCalibrator.load(str(bad))
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        BetaBucketCalibrator.load(str(bad))
    bad.write_text(json.dumps({"format": "k3-spec-calibrator/1", "a0": 1}))
    with pytest.raises(ValueError, match="missing"):
        BetaBucketCalibrator.load(str(bad))


def test_pooled_prior_new_bucket_starts_at_its_position_rate():
    pooled = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    flat = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0, pooled=False))
    for cal in (pooled, flat):
        for n_bucket in range(4):  # position 0 fails for 20 blocks in each of four feature combinations
            for _ in range(20):
                cal.update([(0, n_bucket, 1, 0)], 1, 0)
        cal.update([(1, 0, 1, 0)], 1, 1)  # position 1 has one success
    unseen = (0, 3, 0, 2)
    assert flat.estimate(unseen) == pytest.approx(0.5)
    assert pooled.group_counts(unseen) == (0.0, 80.0)
    assert pooled.estimate(unseen) == pytest.approx(1.0 / 82.0)  # (a0 + 0) / (a0 + b0 + 80)
    assert pooled.estimate((1, 2, 0, 0)) == pytest.approx(2.0 / 3.0)  # another position keeps its own rate
    # a bucket with plenty of data follows its own counts, not its group's
    for _ in range(400):
        pooled.update([(0, 9, 0, 0)], 1, 1)
    assert pooled.estimate((0, 9, 0, 0)) > 0.99
    assert pooled.estimate(unseen) == pytest.approx((1.0 + 400) / (2.0 + 480))


def test_pooled_group_counts_are_the_sum_of_their_buckets_under_forgetting(tmp_path):
    rng = np.random.default_rng(7)
    cal = BetaBucketCalibrator(CalibratorConfig(forgetting=0.99))
    buckets = [[(j, int(rng.integers(0, 3)), 0, 1) for j in range(3)] for _ in range(5)]
    for _ in range(300):
        b = buckets[int(rng.integers(0, 5))]
        nv = int(rng.integers(0, 4))
        cal.update(b, nv, int(rng.integers(0, nv + 1)))
    for pos in range(3):
        members = [k for k in cal.buckets() if k[0] == pos]
        total = np.sum([cal.counts(k) for k in members], axis=0)
        assert np.allclose(cal.group_counts((pos,)), total, rtol=1e-9), pos
    cal.save(str(tmp_path / "prior.json"))
    back = BetaBucketCalibrator.load(str(tmp_path / "prior.json"))
    probe = [(0, 0, 0, 1), (1, 2, 0, 1), (2, 7, 1, 0)]  # the last one was never seen
    assert np.allclose(back.estimate_many(probe), cal.estimate_many(probe), rtol=1e-9)


def test_load_refuses_a_non_boolean_pooled(tmp_path):
    data = BetaBucketCalibrator(CalibratorConfig()).to_json()
    data["pooled"] = "false"  # a string would be truthy: refused, not read as True
    bad = tmp_path / "pooled.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="pooled"):
        BetaBucketCalibrator.load(str(bad))
    data["pooled"] = False
    bad.write_text(json.dumps(data))
    assert BetaBucketCalibrator.load(str(bad)).config.pooled is False
