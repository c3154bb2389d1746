"""Controlled drafter: empirical acceptance matches q, divergence -> nothing, bad files -> clear errors."""
import json

import numpy as np
import pytest

from k3_sglang.spec.drafters import DraftRequest, build_drafter
from k3_sglang.spec.drafters.controlled import PROFILE_Q, ControlledConfig, ControlledDrafter, hash_uniform, prompt_hash

VOCAB = 1000


def _oracle(tmp_path, n=40, out_len=200, seed=0):
    rng = np.random.default_rng(seed)
    rows = [{"input_ids": rng.integers(0, VOCAB, 12).tolist(), "output_ids": rng.integers(0, VOCAB, out_len).tolist()}
            for _ in range(n)]
    path = tmp_path / "ref.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path), rows


def _run_greedy(drafter, rows, gamma):
    """Simulate greedy verify-all against the reference: returns per-request (accepted, counted) totals."""
    totals = {}
    for i, row in enumerate(rows):
        rid, ref = f"r{i}", row["output_ids"]
        out = ref[:1]
        acc = cnt = 0
        while len(out) < len(ref):
            block = drafter.propose([DraftRequest(rid, row["input_ids"], out)], gamma)
            k = int(block.n_drafted[0])
            assert k == min(gamma, len(ref) - len(out))
            drafts = block.tokens[0, :k].tolist()
            truth = ref[len(out):len(out) + k]
            na = next((j for j in range(k) if drafts[j] != truth[j]), k)
            drafter.observe(rid, k, na)
            acc += na
            cnt += na + (na < k)
            out = ref[:len(out) + na + 1]  # accepted drafts + the target's bonus token
        totals[rid] = (acc, cnt, float(block.conf[0, 0]) if k else None)
    return totals


@pytest.mark.parametrize("profile", ["chat", "math", "0.5"])
def test_empirical_acceptance_matches_q(tmp_path, profile):
    path, rows = _oracle(tmp_path)
    d = build_drafter("controlled", oracle_path=path, profile=profile, seed=3, vocab_size=VOCAB)
    totals = _run_greedy(d, rows, 7)
    acc = sum(t[0] for t in totals.values())
    cnt = sum(t[1] for t in totals.values())
    q = PROFILE_Q.get(profile, 0.5)
    assert cnt > 2000
    assert abs(acc / cnt - q) < 0.03, (acc / cnt, q)


def test_mix_profile_gives_two_populations_and_conf_equals_q(tmp_path):
    path, rows = _oracle(tmp_path, n=200, out_len=4)
    d = build_drafter("controlled", oracle_path=path, profile="mix", vocab_size=VOCAB)
    block = d.propose([DraftRequest(f"r{i}", r["input_ids"], r["output_ids"][:1]) for i, r in enumerate(rows)], 3)
    qs = block.conf[:, 0]
    assert set(np.round(qs, 6)) == {0.64, 0.86}
    assert 0.15 < np.mean(qs == 0.86) < 0.45
    assert (block.conf[:, :3] == qs[:, None]).all()


def test_perfect_and_zero_profiles(tmp_path):
    path, rows = _oracle(tmp_path, n=3)
    row = rows[0]
    out = row["output_ids"][:5]
    perfect = build_drafter("controlled", oracle_path=path, profile="perfect", vocab_size=VOCAB)
    b = perfect.propose([DraftRequest("a", row["input_ids"], out)], 6)
    assert b.tokens[0].tolist() == row["output_ids"][5:11] and (b.conf[0] == 1.0).all()
    zero = build_drafter("controlled", oracle_path=path, profile="zero", vocab_size=VOCAB)
    b = zero.propose([DraftRequest("a", row["input_ids"], out)], 6)
    assert b.tokens[0].tolist() == [(t + 1) % VOCAB for t in row["output_ids"][5:11]] and not b.conf.any()


def test_divergence_unknown_prompt_and_end_of_reference(tmp_path):
    path, rows = _oracle(tmp_path, n=2, out_len=10)
    d = build_drafter("controlled", oracle_path=path, profile="perfect", vocab_size=VOCAB)
    row = rows[0]
    ok = d.propose([DraftRequest("a", row["input_ids"], row["output_ids"][:3])], 4)
    assert ok.n_drafted.tolist() == [4]
    bad_out = row["output_ids"][:3] + [(row["output_ids"][3] + 5) % VOCAB]
    assert d.propose([DraftRequest("a", row["input_ids"], bad_out)], 4).n_drafted.tolist() == [0]
    # divergence is permanent for the request
    assert d.propose([DraftRequest("a", row["input_ids"], row["output_ids"][:5])], 4).n_drafted.tolist() == [0]
    assert d.propose([DraftRequest("u", [1, 2, 3], [4])], 4).n_drafted.tolist() == [0]
    tail = d.propose([DraftRequest("b", rows[1]["input_ids"], rows[1]["output_ids"][:8])], 4)
    assert tail.n_drafted.tolist() == [2] and tail.tokens[0, 2:].tolist() == [0, 0] and not tail.conf[0, 2:].any()
    d.release("a")
    assert d.propose([DraftRequest("a", row["input_ids"], row["output_ids"][:3])], 4).n_drafted.tolist() == [4]


def test_hash_uniform_is_deterministic_and_uniform():
    u = hash_uniform(prompt_hash([1, 2, 3]), np.arange(100000), 0)
    assert ((u >= 0) & (u < 1)).all() and abs(u.mean() - 0.5) < 0.01
    assert np.array_equal(u, hash_uniform(prompt_hash([1, 2, 3]), np.arange(100000), 0))
    assert not np.array_equal(u, hash_uniform(prompt_hash([1, 2, 3]), np.arange(100000), 1))


def test_bad_inputs_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown drafter kind"):
        build_drafter("eagle")
    with pytest.raises(ValueError, match="not found"):
        build_drafter("controlled", oracle_path=str(tmp_path / "nope.jsonl"), vocab_size=10)
    with pytest.raises(ValueError, match="oracle"):
        build_drafter("controlled", vocab_size=10)
    path, _ = _oracle(tmp_path, n=1)
    with pytest.raises(ValueError, match="vocab_size"):
        build_drafter("controlled", oracle_path=path)
    with pytest.raises(ValueError, match="profile"):
        build_drafter("controlled", oracle_path=path, profile="poetry", vocab_size=10)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        ControlledConfig(profile="1.5", vocab_size=10)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: bad oracle line"):
        build_drafter("controlled", oracle_path=str(bad), vocab_size=10)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="bad oracle line"):
        ControlledDrafter.from_file(str(bad), ControlledConfig(vocab_size=10))
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no lines"):
        build_drafter("controlled", oracle_path=str(bad), vocab_size=10)
    with pytest.raises(ValueError, match="checkpoint"):
        build_drafter("checkpoint")
