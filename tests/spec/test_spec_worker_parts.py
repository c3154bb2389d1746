"""The SGLang-facing pieces of K3_CSV without a server: registration in SGLang's real registry, the verify layout,
greedy acceptance, the torch req_to_token writer, settings and start-up refusals."""
from __future__ import annotations

import random
import types

import pytest
import torch

from k3_sglang.kernels.kda.chains import chain_layout
from k3_sglang.spec.accept import accept_greedy
from k3_sglang.spec.info import VerifyLayout
from k3_sglang.spec.plugin import assign_req_to_token_pool_torch, register
from k3_sglang.spec.settings import ALGORITHM, SpecSettings


def test_registered_in_sglangs_registry():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    register()
    register()  # idempotent: every SGLang process calls load_plugins, some more than once
    algo = SpeculativeAlgorithm.from_string("k3_csv")
    assert algo.name == ALGORITHM and algo.is_speculative() and not algo.has_draft_kv()
    assert not algo.carries_draft_hidden_states() and not algo.is_eagle()
    for name, member in vars(SpeculativeAlgorithm).items():  # every method SGLang calls on a member exists here
        if not name.startswith("_") and isinstance(member, types.FunctionType):
            assert hasattr(algo, name), name


def test_handle_server_args_sets_a_chain():
    from k3_sglang.spec.algo import K3SpecAlgo

    class Args:
        speculative_num_draft_tokens = None
        speculative_num_steps = None
        speculative_eagle_topk = None
        enable_mixed_chunk = True

    args = Args()
    K3SpecAlgo("K3_CSV", lambda a: None).handle_server_args(args)
    assert (args.speculative_num_draft_tokens, args.speculative_num_steps, args.speculative_eagle_topk) == (8, 7, 1)
    assert args.enable_mixed_chunk is False


def test_verify_layout_indices():
    layout = VerifyLayout(verify_lens=(3, 1, 4), seq_lens=(10, 0, 7))
    assert layout.num_tokens == 8 and layout.l_max == 4 and layout.qo_indptr() == [0, 3, 4, 8]
    assert layout.positions().tolist() == [10, 11, 12, 0, 7, 8, 9, 10]
    dense, packed = chain_layout(torch.tensor(layout.qo_indptr()), layout.num_tokens)  # what the KDA layers read
    assert dense.tolist() == [[0, 1, 2, 8], [3, 8, 8, 8], [4, 5, 6, 7]]
    assert torch.equal(packed, layout.packed_index())
    rows = torch.arange(8.0)[:, None] * 10
    padded = torch.cat([rows, torch.full((1, 1), float("nan"))])[dense]  # [B, L, 1]; padding poisoned
    back = padded.reshape(-1, 1)[layout.packed_index()]
    assert torch.equal(back, rows)  # every packed row comes back, no padding leaks
    with pytest.raises(ValueError, match="length >= 1"):
        VerifyLayout((2, 0), (1, 1))


def test_accept_greedy_against_a_plain_loop():
    rng = random.Random(0)
    for _ in range(200):
        lens = [rng.randint(1, 6) for _ in range(rng.randint(1, 5))]
        tokens, pred = [], []
        for n in lens:
            row = [rng.randint(0, 3) for _ in range(n)]
            tokens += row
            pred += [rng.randint(0, 3) for _ in range(n)]
        commit, outs = accept_greedy(torch.tensor(pred), torch.tensor(tokens), lens)
        at = 0
        for n, c, out in zip(lens, commit, outs):
            expect = 1
            for j in range(1, n):  # draft j accepted iff it is what the target predicted after row j-1
                if tokens[at + j] != pred[at + j - 1]:
                    break
                expect += 1
            assert c == expect and out == pred[at: at + c]
            at += n


def test_assign_req_to_token_pool_torch():
    req_to_token = torch.full((6, 32), -7, dtype=torch.int32)
    rows, starts, ends = torch.tensor([4, 1, 3]), torch.tensor([5, 0, 9]), torch.tensor([9, 3, 9])
    locs = torch.arange(100, 107, dtype=torch.int64)
    assign_req_to_token_pool_torch(rows, req_to_token, starts, ends, locs, 3)
    assert req_to_token[4, 5:9].tolist() == [100, 101, 102, 103]
    assert req_to_token[1, 0:3].tolist() == [104, 105, 106]
    untouched = req_to_token.clone()
    untouched[4, 5:9] = -7
    untouched[1, 0:3] = -7
    assert bool((untouched == -7).all())


@pytest.mark.parametrize("batch", [1, 3, 4, 5, 16, 64])
def test_assign_req_to_token_pool_torch_matches_a_plain_loop_on_random_runs(batch):
    """Both paths (a slice per request up to LOOP_MAX_BATCH, one scatter above) against a reference that writes one
    element at a time; empty runs (a request that committed nothing new) and a poisoned pool so stray writes show."""
    from k3_sglang.spec.plugin import LOOP_MAX_BATCH

    assert LOOP_MAX_BATCH < 5
    gen = torch.Generator().manual_seed(batch)
    for trial in range(5):
        req_to_token = torch.full((96, 64), -7, dtype=torch.int32)
        rows = torch.randperm(96, generator=gen)[:batch]
        starts = torch.randint(0, 40, (batch,), generator=gen, dtype=torch.int32)
        lens = torch.randint(0, 9, (batch,), generator=gen, dtype=torch.int32)
        if trial == 0:
            lens[::2] = 0
        ends = starts + lens
        locs = torch.randint(0, 1 << 30, (int(lens.sum()) + 3,), generator=gen, dtype=torch.int64)  # 3 spare
        expect = req_to_token.clone()
        at = 0
        for r, lo, n in zip(rows.tolist(), starts.tolist(), lens.tolist()):
            for j in range(n):
                expect[r, lo + j] = int(locs[at])
                at += 1
        assign_req_to_token_pool_torch(rows, req_to_token, starts, ends, locs, batch)
        assert torch.equal(req_to_token, expect), (batch, trial)


def test_settings_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("K3_SPEC_VERIFY_MODE", "sometimes")
    with pytest.raises(ValueError, match="K3_SPEC_VERIFY_MODE must be one of"):
        SpecSettings.from_env()
    monkeypatch.setenv("K3_SPEC_VERIFY_MODE", "static")
    monkeypatch.setenv("K3_SPEC_DRAFTER", "controlled")
    SpecSettings.from_env()  # a value check passes; the controlled drafter's oracle is a readiness check
    with pytest.raises(ValueError, match="needs K3_SPEC_ORACLE"):
        SpecSettings.from_env().ready()
    monkeypatch.setenv("K3_SPEC_ORACLE", str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="no such file"):
        SpecSettings.from_env().ready()
    monkeypatch.setenv("K3_SPEC_FORCE_VERIFY_LEN", "0")
    monkeypatch.setenv("K3_SPEC_DRAFTER", "lookup")
    with pytest.raises(ValueError, match="K3_SPEC_FORCE_VERIFY_LEN must be >= 1"):
        SpecSettings.from_env()


def test_start_refusals(monkeypatch):
    from k3_sglang.deployment import parse_sglang_argv
    from k3_sglang.serving.sglang_cpu_limits import refusals

    base = ["--model-path", "/nonexistent", "--speculative-algorithm", "K3_CSV", "--disable-cuda-graph"]
    assert not [r for r in refusals(parse_sglang_argv(base)) if "speculative" in r or "K3_" in r]
    assert not [r for r in refusals(parse_sglang_argv(base + ["--pp-size", "2"])) if "K3_CSV" in r]
    reasons = refusals(parse_sglang_argv(base + ["--pp-size", "2", "--disaggregation-mode", "decode"]))
    assert any("K3_CSV with --pp-size 2 and --disaggregation-mode decode" in r for r in reasons)
    monkeypatch.setenv("K3_SPEC_DRAFTER", "psychic")
    assert any("K3_SPEC_DRAFTER must be one of" in r for r in refusals(parse_sglang_argv(base)))
    eagle = refusals(parse_sglang_argv(["--model-path", "/x", "--speculative-algorithm", "EAGLE"]))
    assert any("--speculative-algorithm EAGLE: SGLang's own speculative workers" in r for r in eagle)


def test_plugin_entry_point_and_hook_target():
    import inspect
    import pkgutil
    from importlib.metadata import entry_points

    from k3_sglang.spec.plugin import ASSIGN_TARGET

    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("k3_spec") == "k3_sglang.spec.plugin:register"
    module, attr = ASSIGN_TARGET.rsplit(".", 1)
    target = getattr(pkgutil.resolve_name(module), attr)
    params = list(inspect.signature(target).parameters)
    assert params == ["req_pool_indices", "req_to_token", "start_offset", "end_offset", "out_cache_loc", "batch_size"]
    assert "_is_cpu" in inspect.getsource(target)  # the gate our replacement stands in for
