"""K3_CSV on one pipeline-parallel server (`--pp-size N`): the hooks that give SGLang's PP + speculation flow our
chain verify.

SGLang 0.5.23 runs speculative decoding inside a pipeline when SGLANG_ENABLE_PP_SPEC=1 (`k3 serve` sets it for
K3_CSV under PP). Its flow is EAGLE-shaped: the speculative worker lives on the last stage only; on every decode
round each earlier stage rebuilds the verify input itself (`_pp_spec_rebuild_verify_input`) and runs its layers on
it (`eagle_prepare_for_verify` + the plain TP worker); the last stage's results travel back around the ring
(accept lens, new seq lens, bonus tokens) and every earlier stage commits its own recurrent state from them
(`_pp_spec_commit_relayed_accept`) before it processes them like the last stage. K3_CSV needs no draft model, so:

1. The first stage plans each decode round (spec/policy.py StepPolicy: drafter + planner, one request set per
   microbatch, every TP rank taking TP rank 0's plan) when SGLang asks it to prepare the verify, and runs a plain
   decode or the chain verify on its own layers (spec/batch_prep.py, the worker's code).
2. A verify round's plan rides the PP proxy dict to the next stage (spec/pp_plan.py; a round without one is a plain
   decode). A middle stage runs the plan it received and passes it on; the last stage's K3SpecWorker runs it,
   accepts greedily and commits its own KDA layers.
3. When the relayed results come back, each earlier stage commits its own KDA layers through SGLang's relay
   (`_pp_spec_commit_relayed_accept` -> SGLang's commit after acceptance, from the relayed chain accept index: the
   worker's commit, spec/contract.py; the per-draft scratch rows are the requests' req-pool rows under
   SGLANG_ENABLE_PP_SPEC, so another microbatch's verify in between does not touch them), and the first stage's
   drafter observes the accept lens (online calibration). A plain decode round advanced KDA in place and carries no
   accept index. MLA needs no commit: accepted rows already sit in their final KV slots.

The relay's results carry per-request speculative tensors, each its own message per hop; a K3_CSV pipeline packs
them into one (spec/pp_plan.py) and unpacks them before SGLang reads them.

SGLang's relay also makes an earlier stage wait for the next microbatch's results before it launches the current
one on a verify round (EAGLE's tree rebuild needs that order); that serialises the stages, so a K3_CSV pipeline
keeps the plain PP order, in which a microbatch's results are still processed before its own next launch.

Hooks (each delegates to SGLang's original for any other algorithm; `installed_hooks()` lists them):
- arg_groups.validation_hook.check_pipeline_parallel_compat (AROUND): K3_CSV passes with SGLANG_ENABLE_PP_SPEC,
  the overlap scheduler off, no PD and no attention DP (SGLang admits only EAGLE there).
- scheduler_pp_mixin._pp_exchange_outputs_before_forward (AROUND): the plain PP order for K3_CSV rounds.
- SchedulerPPMixin._pp_prepare_tensor_dict / _pp_prep_batch_result (AROUND): pack / unpack the results.
- SchedulerPPMixin._pp_launch_batch (AROUND): the microbatch id and received proxy while the stage runs it; the
  plan added to the proxy it sends on.
- SchedulerPPMixin._pp_spec_rebuild_verify_input (AROUND): nothing to rebuild for K3_CSV.
- speculative.eagle_utils.eagle_prepare_for_verify (AROUND): steps 1-2 on an earlier stage.
- SchedulerPPMixin._pp_spec_commit_relayed_accept (AROUND): SGLang's commit, then the drafter's observation (3).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from k3_sglang.spec.pp_plan import pack_accept, plain_plan, plan_from_wire, plan_to_wire, unpack_accept
from k3_sglang.spec.settings import ALGORITHM

logger = logging.getLogger(__name__)

PP_SPEC_ENV = "SGLANG_ENABLE_PP_SPEC"
MIXIN = "sglang.srt.managers.scheduler_pp_mixin.SchedulerPPMixin"
COMPAT_TARGET = "sglang.srt.arg_groups.validation_hook.check_pipeline_parallel_compat"
ORDER_TARGET = "sglang.srt.managers.scheduler_pp_mixin._pp_exchange_outputs_before_forward"
LAUNCH_TARGET = f"{MIXIN}._pp_launch_batch"
REBUILD_TARGET = f"{MIXIN}._pp_spec_rebuild_verify_input"
PREPARE_TARGET = "sglang.srt.speculative.eagle_utils.eagle_prepare_for_verify"
COMMIT_TARGET = f"{MIXIN}._pp_spec_commit_relayed_accept"
PACK_TARGET = f"{MIXIN}._pp_prepare_tensor_dict"
UNPACK_TARGET = f"{MIXIN}._pp_prep_batch_result"


def is_k3_csv(algorithm) -> bool:
    """True for SGLang's algorithm object (or a server-args name) of K3_CSV."""
    name = getattr(algorithm, "name", algorithm)
    return isinstance(name, str) and name.upper() == ALGORITHM


def pp_spec_enabled() -> bool:
    """SGLANG_ENABLE_PP_SPEC as SGLang itself reads it."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_ENABLE_PP_SPEC.get())


def pipeline_refusals(cfg) -> list[str]:
    """Why K3_CSV cannot run inside this pipeline (SGLang server-args names); empty when it can."""
    reasons = []
    if not pp_spec_enabled():
        reasons.append(f"K3_CSV with --pp-size > 1 needs {PP_SPEC_ENV}=1 (SGLang's pipeline speculation relay; "
                       "`k3 serve` sets it)")
    if not getattr(cfg, "disable_overlap_schedule", False):
        reasons.append("K3_CSV with --pp-size > 1 needs --disable-overlap-schedule (pipelines run without it)")
    mode = getattr(cfg, "disaggregation_mode", "null") or "null"
    if mode != "null":
        reasons.append(f"K3_CSV with --pp-size > 1 and --disaggregation-mode {mode}: SGLang's pipeline relay is "
                       "aggregated-only; run the PP prefill server without speculation and K3_CSV on the decode "
                       "server")
    if getattr(cfg, "enable_dp_attention", False):
        reasons.append("K3_CSV with --pp-size > 1 and attention DP: every stage must run the same batch")
    return reasons


@dataclass
class _Launch:
    """One microbatch being run by this stage: its id, the proxy it received, the plan it sends on."""
    mb_id: int
    proxy_in: object | None
    wire_out: dict | None = None


@dataclass
class _Pending:
    """A chain verify the first stage planned and ran whose accept lens have not come back yet (for its drafter)."""
    rids: tuple[str, ...]
    reqs: list
    lens: list[int]


@dataclass
class _StageState:
    launch: _Launch | None = None
    pending: dict[int, _Pending] = field(default_factory=dict)  # microbatch id -> its verify awaiting results
    policy: object | None = None  # the first stage's StepPolicy


_STATE = _StageState()


def check_pipeline_compat(original, cfg, *args, **kwargs):
    """AROUND check_pipeline_parallel_compat(cfg): K3_CSV's own pipeline conditions instead of EAGLE-only."""
    if not is_k3_csv(getattr(cfg, "speculative_algorithm", None)):
        return original(cfg, *args, **kwargs)
    reasons = pipeline_refusals(cfg)
    if reasons:
        raise ValueError("; ".join(reasons))
    return None


def exchange_outputs_first(original, cur_batch, spec_relay, is_last_rank, async_batch_depth):
    """AROUND _pp_exchange_outputs_before_forward (same parameters, called once per loop iteration): False for a
    K3_CSV round (the plain PP order: launch, then receive and process the next microbatch's results).

    That order is enough for K3_CSV: with L = pp_size microbatches in the ring, the results a stage receives after
    launching microbatch m are those of m + 1, which it launches next, so every microbatch's accept lens are
    committed and its tokens appended before its next round is planned."""
    if cur_batch is not None and async_batch_depth == 0 and is_k3_csv(cur_batch.spec_algorithm):
        return False
    return original(cur_batch, spec_relay, is_last_rank, async_batch_depth)


def launch_batch(original, scheduler, mb_id, cur_batch, pp_proxy_tensors, *args, **kwargs):
    """AROUND _pp_launch_batch: run the microbatch with its launch context; send the plan with the proxy."""
    if not is_k3_csv(scheduler.spec_algorithm):
        return original(scheduler, mb_id, cur_batch, pp_proxy_tensors, *args, **kwargs)
    if _STATE.pending.pop(mb_id, None) is not None:  # its relay is always processed before the next launch
        logger.warning("K3_CSV: microbatch %d relaunched before its verify results came back", mb_id)
    launch = _STATE.launch = _Launch(int(mb_id), pp_proxy_tensors)
    try:
        result, event = original(scheduler, mb_id, cur_batch, pp_proxy_tensors, *args, **kwargs)
    finally:
        _STATE.launch = None
    proxy = getattr(result, "pp_hidden_states_proxy_tensors", None)
    if launch.wire_out is not None and proxy is not None:
        proxy.tensors.update(launch.wire_out)
    return result, event


def pack_results(original, scheduler, result, batch, *args, **kwargs):
    """AROUND _pp_prepare_tensor_dict(result, batch) on the last stage: the speculative results as one tensor."""
    tensors = original(scheduler, result, batch, *args, **kwargs)
    return pack_accept(tensors, _width()) if is_k3_csv(scheduler.spec_algorithm) else tensors


def unpack_results(original, scheduler, batch, mb_metadata, pp_outputs, *args, **kwargs):
    """AROUND _pp_prep_batch_result(batch, mb_metadata, pp_outputs): SGLang reads the unpacked entries from a copy;
    the dict this stage forwards around the ring stays packed."""
    if is_k3_csv(scheduler.spec_algorithm):
        tensors = unpack_accept(pp_outputs.tensors, batch.seq_lens.dtype, _width())
        if tensors is not None:
            pp_outputs = type(pp_outputs)(tensors)
    return original(scheduler, batch, mb_metadata, pp_outputs, *args, **kwargs)


def rebuild_verify_input(original, scheduler, batch, *args, **kwargs):
    """AROUND _pp_spec_rebuild_verify_input: K3_CSV's verify input is built from the plan, not a relayed tree."""
    if is_k3_csv(batch.spec_algorithm):
        return None
    return original(scheduler, batch, *args, **kwargs)


def _width() -> int:
    from sglang.srt.runtime_context import get_spec

    return int(get_spec().speculative_num_draft_tokens)


def _first_stage_policy(target_worker):
    if _STATE.policy is None:
        from k3_sglang.spec.policy import StepPolicy
        from k3_sglang.spec.settings import spec_settings
        from sglang.srt.runtime_context import get_spec

        gamma = int(get_spec().speculative_num_draft_tokens) - 1
        _STATE.policy = StepPolicy(spec_settings(), gamma, int(target_worker.model_runner.model_config.vocab_size))
    return _STATE.policy


def prepare_for_verify(original, verify_input, req_to_token_pool, batch, target_worker, *args, **kwargs):
    """AROUND eagle_prepare_for_verify on an earlier stage: (this round's ForwardBatch, can_run_cuda_graph=False)."""
    if not is_k3_csv(batch.spec_algorithm):
        return original(verify_input, req_to_token_pool, batch, target_worker, *args, **kwargs)
    from sglang.srt.distributed import get_tp_group
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.runtime_context import get_spec

    from k3_sglang.spec.batch_prep import to_plain_decode, to_verify

    launch = _STATE.launch
    if launch is None:
        raise RuntimeError("K3_CSV: a pipeline verify was prepared outside a microbatch launch")
    width = int(get_spec().speculative_num_draft_tokens)
    if launch.proxy_in is None:  # the first stage plans
        context_len = int(target_worker.model_runner.model_config.context_len)
        lens, drafts = _first_stage_policy(target_worker).plan(batch, width, context_len, get_tp_group(),
                                                               group=launch.mb_id)
    else:  # no plan with the proxy: a plain decode round
        lens, drafts = plan_from_wire(launch.proxy_in.tensors, len(batch.reqs)) or plain_plan(len(batch.reqs))
    req_to_token = req_to_token_pool.req_to_token
    if max(lens) <= 1:
        to_plain_decode(batch, req_to_token, batch.device)
    else:
        launch.wire_out = plan_to_wire(lens, drafts, width - 1)
        to_verify(batch, req_to_token, lens, drafts, width, batch.device)
        if _STATE.policy is not None:  # the first stage: its drafter observes the relayed accept lens
            _STATE.pending[launch.mb_id] = _Pending(tuple(r.rid for r in batch.reqs), list(batch.reqs), list(lens))
    return ForwardBatch.init_new(batch, target_worker.model_runner, return_hidden_states_before_norm=False), False


def commit_relayed_accept(original, scheduler, batch, fwd_batch, fwd_rids, live_rids, verify_out_cache_loc,
                          pp_outputs, *args, **kwargs):
    """AROUND _pp_spec_commit_relayed_accept: SGLang commits this stage's KDA layers from the relayed accept index
    (a verify round; a plain decode round carries none); then the first stage's drafter observes the accept lens."""
    result = original(scheduler, batch, fwd_batch, fwd_rids, live_rids, verify_out_cache_loc, pp_outputs,
                      *args, **kwargs)
    if not is_k3_csv(scheduler.spec_algorithm):
        return result
    key = tuple(fwd_rids)
    mb_id = next((m for m, p in _STATE.pending.items() if p.rids == key), None)
    if mb_id is None:
        return result  # not the first stage, or a plain decode round
    pending = _STATE.pending.pop(mb_id)
    commit_lens = pp_outputs["spec_accept_lens"].to(device="cpu", dtype=torch.int64)
    if tuple(commit_lens.shape) != (len(pending.lens),):
        raise RuntimeError(f"K3_CSV: relayed accept lens {tuple(commit_lens.shape)} for a verify of "
                           f"{len(pending.lens)} requests")
    _STATE.policy.observe(pending.reqs, pending.lens, [int(c) for c in commit_lens.tolist()])
    return result


def installed_hooks():
    """(target, hook, hook type name) of every hook the K3_CSV plugin installs for pipelines."""
    return [(COMPAT_TARGET, check_pipeline_compat, "AROUND"),
            (ORDER_TARGET, exchange_outputs_first, "AROUND"),
            (PACK_TARGET, pack_results, "AROUND"),
            (UNPACK_TARGET, unpack_results, "AROUND"),
            (LAUNCH_TARGET, launch_batch, "AROUND"),
            (REBUILD_TARGET, rebuild_verify_input, "AROUND"),
            (PREPARE_TARGET, prepare_for_verify, "AROUND"),
            (COMMIT_TARGET, commit_relayed_accept, "AROUND")]
