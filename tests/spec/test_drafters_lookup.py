"""Prompt-lookup drafter: right continuations, nothing on fresh text, incremental == from-scratch, speed bound."""
import time

import numpy as np
import pytest

from k3_sglang.spec.drafters import DraftRequest, build_drafter
from k3_sglang.spec.drafters.lookup import LookupConfig, LookupDrafter, NgramIndex, n_bucket, reference_match


def test_repetitive_sequence_proposes_the_continuation():
    d = LookupDrafter()
    prompt = [10, 11, 12, 13, 14, 15, 16]
    out = [20, 10, 11, 12]  # root 12 re-quotes the prompt: next should be 13 14 15 16 ...
    block = d.propose([DraftRequest("r", prompt, out)], 4)
    assert block.n_drafted.tolist() == [4]
    assert block.tokens[0].tolist() == [13, 14, 15, 16]


def test_periodic_sequence_chains_past_the_context_end():
    d = LookupDrafter()
    block = d.propose([DraftRequest("r", [1, 2, 3], [1, 2, 3])], 7)
    assert block.tokens[0].tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert block.n_drafted[0] == 7


def test_fresh_sequence_proposes_nothing():
    d = LookupDrafter()
    block = d.propose([DraftRequest("r", list(range(100)), [100, 101])], 5)
    assert block.n_drafted.tolist() == [0]
    assert not block.tokens.any() and not block.conf.any()
    assert not block.survival().any()


def test_empty_output_and_bad_gamma():
    d = LookupDrafter()
    assert d.propose([DraftRequest("r", [5], [])], 3).n_drafted.tolist() == [0]
    with pytest.raises(ValueError, match="gamma"):
        d.propose([DraftRequest("r", [5], [])], 0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_incremental_index_equals_from_scratch(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 8))  # small vocab: many repeats and conflicting continuations
    seq = rng.integers(0, vocab, size=300).tolist()
    idx = NgramIndex(1, 6)
    pos = 0
    while pos < len(seq):
        step = int(rng.integers(1, 9))
        idx.extend(seq[pos:pos + step])
        pos += step
        assert idx.match() == reference_match(seq[:pos], 1, 6), pos
    fresh = NgramIndex(1, 6)
    fresh.extend(seq)
    assert fresh.last == idx.last


@pytest.mark.parametrize("seed,window", [(0, 7), (1, 20), (2, 33), (3, 5)])
def test_windowed_index_equals_from_scratch_and_stays_bounded(seed, window):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 6))
    seq = rng.integers(0, vocab, size=400).tolist()
    idx = NgramIndex(1, 6, window)
    pos = 0
    while pos < len(seq):
        step = int(rng.integers(1, 9)) if rng.random() < 0.9 else int(rng.integers(2 * window, 3 * window))  # jumps
        idx.extend(seq[pos:pos + step])
        pos += step
        assert idx.match() == reference_match(seq[:pos], 1, 6, window), pos
        assert idx.num_entries() <= 6 * window
        assert all((v >> 2) >= len(idx.tokens) - window for d in idx.last.values() for v in d.values())
    fresh = NgramIndex(1, 6, window)
    fresh.extend(seq)  # one long prompt: only the last 2 W positions are indexed
    assert fresh.last == idx.last


def test_window_bounds_memory_of_a_long_context():
    import tracemalloc

    rng = np.random.default_rng(5)
    seq = rng.integers(0, 50000, 60000).tolist()  # few repeats: about one entry per n per position
    tracemalloc.start()
    capped = NgramIndex(1, 6, 8192)
    capped.extend(seq)
    capped_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    full = NgramIndex(1, 6, 0)
    full.extend(seq)
    assert capped.num_entries() <= 6 * 8192 < full.num_entries() / 6
    per_entry = capped_bytes / capped.num_entries()
    # tokens list included; DEFAULT_WINDOW's "about 60 MB per request" assumes at most 160 bytes per entry
    assert per_entry < 160, f"{per_entry:.0f} bytes per index entry"
    with pytest.raises(ValueError, match="window"):
        LookupConfig(window=-1)


def test_features_and_confidence_bounds():
    d = LookupDrafter(LookupConfig(max_n=4))
    rng = np.random.default_rng(7)
    reqs = [DraftRequest(f"r{i}", rng.integers(0, 5, 50).tolist(), rng.integers(0, 5, 10).tolist()) for i in range(8)]
    block = d.propose(reqs, 6)
    assert block.tokens.shape == block.conf.shape == (8, 6) and block.tokens.dtype == np.int64
    assert ((block.conf >= 0) & (block.conf <= 1)).all()
    s = block.survival()
    assert (np.diff(s, axis=1) <= 1e-15).all() and ((s >= 0) & (s <= 1)).all()
    assert [n_bucket(n) for n in (1, 2, 3, 4, 5, 6)] == [0, 1, 2, 2, 3, 3]


def test_settings_window_reaches_the_served_drafter(monkeypatch):
    from k3_sglang.spec.policy import StepPolicy
    from k3_sglang.spec.settings import SpecSettings

    monkeypatch.setenv("K3_SPEC_LOOKUP_WINDOW", "128")
    settings = SpecSettings.from_env()
    assert settings.lookup_window == 128
    assert StepPolicy(settings, gamma=4, vocab_size=64).drafter.config.window == 128
    assert build_drafter("lookup").config.window == 65536


def test_observe_calibrates_confidence_upward_for_accepted_buckets():
    d = build_drafter("lookup")
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    out = [1, 2, 3]
    first = d.propose([DraftRequest("r", prompt, out)], 4).conf[0].copy()
    for _ in range(50):
        d.propose([DraftRequest("r", prompt, out)], 4)
        d.observe("r", 4, 4)
    after = d.propose([DraftRequest("r", prompt, out)], 4).conf[0]
    assert (after > first + 0.3).all()
    with pytest.raises(ValueError, match="n_accepted"):
        d.observe("r", 2, 3)
    d.release("r")
    assert d.num_tracked() == 0
    d.observe("r", 1, 1)  # released rid: no-op


def test_speed_64_requests_4k_context_100_steps():
    rng = np.random.default_rng(0)
    d = LookupDrafter()
    prompts = [rng.integers(0, 64, 4096).tolist() for _ in range(64)]
    outs = [[int(p[-1])] for p in prompts]
    t0 = time.perf_counter()
    d.propose([DraftRequest(f"r{i}", prompts[i], outs[i]) for i in range(64)], 7)
    t_prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(100):
        for o in outs:
            o.extend(rng.integers(0, 64, int(rng.integers(1, 9))).tolist())
        d.propose([DraftRequest(f"r{i}", prompts[i], outs[i]) for i in range(64)], 7)
    t_steps = time.perf_counter() - t0
    # Per step the work is O(new tokens), not O(context): 100 steps x 64 requests stay well under a second each.
    assert t_steps / 100 < 0.05, f"{t_steps / 100 * 1e3:.1f} ms per step"
    assert t_prefill < 15.0, f"indexing 64 x 4K tokens took {t_prefill:.1f} s"
