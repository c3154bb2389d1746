"""K3_CSV's pipeline hooks (spec/pp_hooks.py) against the installed SGLang: the targets exist with the parameters the
hooks pass on, every hook hands any other algorithm to SGLang untouched, and the bookkeeping between a stage's verify
and the relayed accept lens commits exactly what the last stage accepted."""
from __future__ import annotations

import inspect
import pkgutil
import types

import pytest
import torch

from k3_sglang.spec import pp_hooks
from k3_sglang.spec.pp_plan import plan_to_wire

K3 = types.SimpleNamespace(name="K3_CSV")
EAGLE = types.SimpleNamespace(name="EAGLE")
# the parameters each hook reads by position (after the original), as SGLang 0.5.23 names them
EXPECTED_PARAMS = {
    pp_hooks.COMPAT_TARGET: ["cfg"],
    pp_hooks.ORDER_TARGET: ["cur_batch", "spec_relay", "is_last_rank", "async_batch_depth"],
    pp_hooks.LAUNCH_TARGET: ["self", "mb_id", "cur_batch", "pp_proxy_tensors"],
    pp_hooks.PACK_TARGET: ["self", "result", "batch"],
    pp_hooks.UNPACK_TARGET: ["self", "batch", "mb_metadata", "pp_outputs"],
    pp_hooks.REBUILD_TARGET: ["self", "batch"],
    pp_hooks.PREPARE_TARGET: ["verify_input", "req_to_token_pool", "batch", "target_worker"],
    pp_hooks.COMMIT_TARGET: ["self", "batch", "fwd_batch", "fwd_rids", "live_rids", "verify_out_cache_loc",
                             "pp_outputs"],
}


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(pp_hooks, "_STATE", pp_hooks._StageState())


@pytest.mark.parametrize("target,hook,kind", pp_hooks.installed_hooks(),
                         ids=[t.rsplit(".", 1)[-1] for t, _, _ in pp_hooks.installed_hooks()])
def test_targets_exist_with_the_parameters_the_hooks_pass(target, hook, kind):
    fn = inspect.unwrap(pkgutil.resolve_name(target))
    params = list(inspect.signature(fn).parameters)
    assert params[: len(EXPECTED_PARAMS[target])] == EXPECTED_PARAMS[target], params
    assert kind == "AROUND"


def _recorder():
    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "sglang's"
    return original, calls


def test_every_hook_delegates_other_algorithms_to_sglang():
    batch = types.SimpleNamespace(spec_algorithm=EAGLE)
    sched = types.SimpleNamespace(spec_algorithm=EAGLE)
    cfg = types.SimpleNamespace(speculative_algorithm="EAGLE")
    cases = [
        (pp_hooks.check_pipeline_compat, (cfg,)),
        (pp_hooks.exchange_outputs_first, (batch, True, False, 0)),
        (pp_hooks.launch_batch, (sched, 0, batch, None, [], "queue")),
        (pp_hooks.rebuild_verify_input, (sched, batch)),
        (pp_hooks.unpack_results, (sched, batch, None, types.SimpleNamespace(tensors={"k3_csv_accept": 1}))),
        (pp_hooks.prepare_for_verify, ("verify", "pool", batch, "worker")),
        (pp_hooks.commit_relayed_accept, (sched, batch, batch, ["a"], ["a"], None, {"spec_accept_lens": 1})),
    ]
    for hook, args in cases:
        original, calls = _recorder()
        assert hook(original, *args) == "sglang's", hook.__name__
        assert calls == [(args, {})], hook.__name__


def test_sglangs_own_pipeline_check_still_refuses_other_algorithms():
    original = inspect.unwrap(pkgutil.resolve_name(pp_hooks.COMPAT_TARGET))
    cfg = types.SimpleNamespace(speculative_algorithm="NGRAM", disable_overlap_schedule=True,
                                enable_multi_layer_eagle=False, disaggregation_mode="null")
    with pytest.raises(AssertionError, match="only supports EAGLE"):
        pp_hooks.check_pipeline_compat(original, cfg)


@pytest.mark.parametrize("env,overrides,message", [
    ("1", {}, None),
    (None, {}, "SGLANG_ENABLE_PP_SPEC=1"),
    ("false", {}, "SGLANG_ENABLE_PP_SPEC=1"),
    ("1", {"disable_overlap_schedule": False}, "--disable-overlap-schedule"),
    ("1", {"disaggregation_mode": "prefill"}, "aggregated-only"),
    ("1", {"enable_dp_attention": True}, "attention DP"),
])
def test_k3_csv_pipeline_conditions(monkeypatch, env, overrides, message):
    if env is None:
        monkeypatch.delenv(pp_hooks.PP_SPEC_ENV, raising=False)
    else:
        monkeypatch.setenv(pp_hooks.PP_SPEC_ENV, env)
    cfg = types.SimpleNamespace(speculative_algorithm="k3_csv", disable_overlap_schedule=True,
                                disaggregation_mode="null", enable_dp_attention=False)
    for name, value in overrides.items():
        setattr(cfg, name, value)
    original, calls = _recorder()
    if message is None:
        assert pp_hooks.check_pipeline_compat(original, cfg) is None
    else:
        with pytest.raises(ValueError, match=message):
            pp_hooks.check_pipeline_compat(original, cfg)
    assert calls == []  # SGLang's EAGLE-only rule is not consulted for K3_CSV


def test_results_travel_packed_and_sglang_reads_them_unpacked(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import PPProxyTensors

    sched = types.SimpleNamespace(spec_algorithm=K3)
    sent = {"next_token_ids": torch.arange(8), "spec_accept_lens": torch.tensor([3, 1], dtype=torch.int32),
            "spec_new_seq_lens": torch.tensor([40, 9]), "spec_bonus_tokens": torch.tensor([5, 6]),
            "spec_accept_index": torch.tensor([[0, 1, 2, -1], [4, -1, -1, -1]])}
    monkeypatch.setattr(pp_hooks, "_width", lambda: 4)
    packed = pp_hooks.pack_results(lambda *a: dict(sent), sched, "result", "batch")
    assert set(packed) == {"next_token_ids", "k3_csv_accept"}
    assert pp_hooks.pack_results(lambda *a: dict(sent), types.SimpleNamespace(spec_algorithm=EAGLE), "r", "b") == sent
    wire = PPProxyTensors({**packed, "__msg_type__": "output"})
    seen = []
    live = types.SimpleNamespace(seq_lens=torch.tensor([37, 8]))
    pp_hooks.unpack_results(lambda s, b, m, out: seen.append(out), sched, live, "md", wire)
    got = seen[0].tensors
    for key, value in sent.items():
        assert torch.equal(got[key], value) and got[key].dtype == value.dtype, key
    assert set(wire.tensors) == {"next_token_ids", "k3_csv_accept", "__msg_type__"}  # forwarded as received


def test_k3_csv_rounds_keep_the_plain_pipeline_order():
    """SGLang's relay exchanges results before launching a decode round on an earlier stage (EAGLE needs it); a
    K3_CSV round launches first, as a pipeline without speculation does, unless async batch depth asks otherwise."""
    original = inspect.unwrap(pkgutil.resolve_name(pp_hooks.ORDER_TARGET))
    decode = types.SimpleNamespace(spec_algorithm=K3, forward_mode=types.SimpleNamespace(is_extend=lambda: False),
                                   is_extend_in_batch=False)
    eagle = types.SimpleNamespace(**{**vars(decode), "spec_algorithm": EAGLE})
    kw = dict(spec_relay=True, is_last_rank=False, async_batch_depth=0)
    assert original(cur_batch=eagle, **kw) is True  # SGLang's own rule, still applied to EAGLE
    assert pp_hooks.exchange_outputs_first(original, cur_batch=eagle, **kw) is True
    assert pp_hooks.exchange_outputs_first(original, cur_batch=decode, **kw) is False
    assert pp_hooks.exchange_outputs_first(original, cur_batch=decode, **{**kw, "async_batch_depth": 1}) is True
    assert pp_hooks.exchange_outputs_first(original, cur_batch=None, **kw) is False


def test_launch_sends_the_plan_with_the_proxy_and_drops_a_stale_record():
    sched = types.SimpleNamespace(spec_algorithm=K3)
    pp_hooks._STATE.pending[1] = pp_hooks._Pending(("old",), [], [2])
    plan = plan_to_wire([3, 1], [[7, 8], []], 3)
    proxy = types.SimpleNamespace(tensors={"hidden_states": torch.zeros(4, 2)})

    def original(scheduler, mb_id, cur_batch, pp_proxy_tensors, *rest):
        launch = pp_hooks._STATE.launch
        assert (launch.mb_id, launch.proxy_in) == (1, "received")
        launch.wire_out = plan  # what prepare_for_verify leaves for this microbatch
        return types.SimpleNamespace(pp_hidden_states_proxy_tensors=proxy), "event"

    result, event = pp_hooks.launch_batch(original, sched, 1, "batch", "received", [], "queue")
    assert event == "event" and pp_hooks._STATE.launch is None and 1 not in pp_hooks._STATE.pending
    assert set(proxy.tensors) == {"hidden_states", *plan}

    def plain(scheduler, mb_id, cur_batch, pp_proxy_tensors, *rest):  # a plain-decode round leaves no plan
        return types.SimpleNamespace(pp_hidden_states_proxy_tensors=proxy), "event"

    proxy.tensors = {"hidden_states": torch.zeros(4, 2)}
    pp_hooks.launch_batch(plain, sched, 0, "batch", "received", [], "queue")
    assert set(proxy.tensors) == {"hidden_states"}


class _Policy:
    def __init__(self):
        self.seen = []

    def observe(self, reqs, lens, commit_lens):
        self.seen.append((reqs, lens, commit_lens))


def test_relayed_results_commit_through_sglang_then_the_first_stage_observes_once():
    """SGLang's own relay commit runs for every round (it commits a verify from the relayed accept index, and
    returns at once for a plain round); the first stage's drafter then observes the matching verify once."""
    policy = _Policy()
    sched = types.SimpleNamespace(spec_algorithm=K3)
    pp_hooks._STATE.policy = policy
    pp_hooks._STATE.pending[0] = pp_hooks._Pending(("a", "b"), ["req a", "req b"], [4, 2])
    pp_hooks._STATE.pending[1] = pp_hooks._Pending(("c",), ["req c"], [3])
    outputs = {"spec_accept_lens": torch.tensor([3, 1], dtype=torch.int32)}
    original, calls = _recorder()
    args = (sched, "batch", "fwd", ["a", "b"], ["a", "b"], None, outputs)
    assert pp_hooks.commit_relayed_accept(original, *args) == "sglang's"
    assert calls == [(args, {})] and list(pp_hooks._STATE.pending) == [1]
    assert policy.seen == [(["req a", "req b"], [4, 2], [3, 1])]
    pp_hooks.commit_relayed_accept(original, *args)  # nothing pending for these requests: SGLang's commit only
    assert len(calls) == 2 and len(policy.seen) == 1
    with pytest.raises(RuntimeError, match="relayed accept lens"):
        pp_hooks.commit_relayed_accept(original, sched, None, None, ["c"], ["c"], None, outputs)


def test_k3_csv_validation_admits_a_pipeline_only_with_the_relay(monkeypatch):
    from k3_sglang.spec.algo import validate_server_args

    args = types.SimpleNamespace(pp_size=2, speculative_num_draft_tokens=4, speculative_eagle_topk=1,
                                 disable_overlap_schedule=True, disaggregation_mode="null", enable_dp_attention=False)
    monkeypatch.delenv(pp_hooks.PP_SPEC_ENV, raising=False)
    with pytest.raises(ValueError, match="--speculative-algorithm K3_CSV with --pp-size > 1 needs SGLANG_ENABLE_PP_SPEC=1"):
        validate_server_args(args)
    monkeypatch.setenv(pp_hooks.PP_SPEC_ENV, "1")
    assert validate_server_args(args) is None
    args.disaggregation_mode = "decode"
    with pytest.raises(ValueError, match="aggregated-only"):
        validate_server_args(args)
