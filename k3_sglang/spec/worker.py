"""K3_CSV's worker: SGLang's scheduler calls `forward_batch_generation` once per step (V2 schema, no overlap).

1. Extend rounds (prefill, chunked prefill) run the plain target forward and sample the first token.
2. Decode rounds: the policy (spec/policy.py) asks the drafter for a chain per request with per-token confidence
   and the planner for each request's verify length (1 = no draft); every TP rank uses rank 0's lengths. On the
   last stage of a pipeline the first stage's plan arrives with the proxy instead (spec/pp_hooks.py, pp_plan.py).
3. All lengths 1: a plain decode forward (the root at the committed position; KDA advances in place).
4. Otherwise one TARGET_VERIFY forward over the packed chains (spec/info.py): MLA attends them as an extend over
   the committed prefix and writes their KV rows into the slots SGLang reserved; KDA runs them without touching
   its pool and leaves the state after every token in SGLang's per-draft scratch. Acceptance gives commit_len =
   accepted + 1 per request: greedy (spec/accept.py) for an all-greedy batch, otherwise the speculative-sampling
   rule over SGLang's sampling transforms for sampled requests (spec/sampled_verify.py, spec/rejection.py; its
   result is TP rank 0's on every rank), SGLang's commit after acceptance copies that step
   into the KDA pools (spec/contract.py: SGLang's own two calls), and the
   accepted drafts plus the bonus token go back to the scheduler (stride = chain width). Rejected rows' KV slots
   stay reserved past the committed length and are overwritten by the next step.
5. A step the policy decided before SGLang prepared it to run as plain decode (spec/plain_path.py) arrives with
   SGLang's NONE algorithm: SGLang prepared it and processes its result as without speculation, and the worker runs
   the target forward only.
With the checkpoint drafter (a draft model) every target forward of steps 1-4 also returns the target's hidden states
at the draft's layers (`capture_hidden_mode`, spec/root_capture.py), and the draft runs inside the policy's step 2.
"""
from __future__ import annotations

import logging
import time

import torch

from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

from k3_sglang.spec import plain_path
from k3_sglang.spec.accept import accept_greedy
from k3_sglang.spec.batch_prep import to_plain_decode, to_verify
from k3_sglang.spec.contract import check_loaded_model, commit_after_verify
from k3_sglang.spec.info import draft_state, one_token_draft_state
from k3_sglang.spec.policy import StepPolicy
from k3_sglang.spec.pp_plan import plain_plan, plan_from_wire
from k3_sglang.spec.sampled_verify import accept_sampled
from k3_sglang.spec.settings import spec_settings
from k3_sglang.spec.step_record import StepRecorder

logger = logging.getLogger(__name__)


class K3SpecWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> None:
        super().__init__()
        from sglang.srt.distributed import get_tp_group
        from sglang.srt.runtime_context import get_device, get_spec

        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        check_loaded_model(self.model_runner.model_config)  # a hub id escaped the start-up refusal
        self.device = get_device().device
        self.width = int(get_spec().speculative_num_draft_tokens)
        self.speculative_num_draft_tokens = self.width
        self.settings = spec_settings()
        vocab = int(self.model_runner.model_config.vocab_size)
        self.capture = None  # the checkpoint drafter's root hidden states (spec/root_capture.py)
        if self.settings.drafter == "checkpoint":
            from k3_sglang.spec.root_capture import RootCapture, target_heads

            target = target_heads(self.model_runner.model, self.model_runner.model_config)
            self.policy = StepPolicy(self.settings, self.width - 1, vocab, target)
            self.capture = RootCapture(self.model_runner.model, lambda: self.policy.drafter)
        else:
            self.policy = StepPolicy(self.settings, self.width - 1, vocab)
        self.tp_group = get_tp_group()
        self.recorder = StepRecorder(self.settings.record, rank=self.tp_group.rank_in_group)
        self.context_len = int(self.model_runner.model_config.context_len)
        self.spec_algorithm = None  # K3_CSV's algorithm object, kept while the running batch takes the plain path
        refusal = plain_path.plain_path_refusal(server_args, self.settings)
        plain_path.take_plain_path(self if refusal is None else None)
        if refusal is not None:
            logger.info("K3_CSV: plain decode steps stay on SGLang's speculative path: %s", refusal)
        logger.info("K3_CSV: chain width %d, drafter %s, verify mode %s", self.width, self.settings.drafter,
                    self.settings.verify_mode)

    def _capture_mode(self, verify: bool = False):
        return None if self.capture is None else self.capture.mode(verify)

    @property
    def draft_worker(self):
        return None  # drafts come from spec/drafters in this worker (a draft model too), no SGLang draft worker

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self.policy.release(rid)

    def clear_cache_pool(self) -> None:
        self.policy.reset()

    # -- one scheduler step
    def forward_batch_generation(self, batch, on_publish=None, pp_proxy_tensors=None) -> GenerationBatchResult:
        if batch.spec_algorithm.is_none():
            return self._plain_path_step(batch)
        if batch.forward_mode.is_decode():
            return self._decode_round(batch, on_publish, pp_proxy_tensors)
        return self._extend_round(batch, on_publish, pp_proxy_tensors)

    def _extend_round(self, batch, on_publish, pp_proxy_tensors) -> GenerationBatchResult:
        res = self._target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors,
                                                           capture_hidden_mode=self._capture_mode())
        if self.capture is not None:
            self.capture.after_one_token(batch.reqs, res.logits_output)
        new_seq_lens = batch.seq_lens.clone()
        if on_publish is not None:
            on_publish(new_seq_lens)
        return self._one_token_result(res, new_seq_lens, decode=False)

    def _plain_path_step(self, batch) -> GenerationBatchResult:
        """A step on SGLang's non-speculative path (spec/plain_path.py): SGLang prepared the batch (one new slot per
        request, seq_lens advanced) and reads the result as a no-spec server's; the input ids are the requests' last
        tokens (SGLang's future map relays them only for a non-speculative scheduler)."""
        t0 = time.perf_counter()
        if batch.input_ids is None and batch.forward_mode.is_decode():
            batch.input_ids = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.int64,
                                           device=self.device)
        res = self._target_worker.forward_batch_generation(batch)
        if self.recorder.path:
            n = len(batch.reqs)
            self.recorder.step(kind="decode", path="plain", n_reqs=n, n_tokens=n, l_max=1,
                               seconds=time.perf_counter() - t0, drafted=0, accepted=0)
        return res

    def _one_token_result(self, res, new_seq_lens, decode: bool) -> GenerationBatchResult:
        """The result of a step that emitted one sampled token per request. SGLang reads an extend's tokens one per
        request, a decode round's at the chain stride (column 0 of [B, width])."""
        state = one_token_draft_state(self.width, new_seq_lens, res.next_token_ids)
        return GenerationBatchResult(
            logits_output=res.logits_output, next_token_ids=state.accept_tokens if decode else res.next_token_ids,
            can_run_cuda_graph=False,
            accept_lens=state.accept_lens, new_seq_lens=new_seq_lens, next_draft_input=state,
            speculative_num_draft_tokens=self.width)

    def _round_plan(self, batch, pp_proxy_tensors) -> tuple[list[int], list[list[int]]]:
        """This round's verify lengths and drafts: planned here, or (the last pipeline stage) as the first stage
        planned them (spec/pp_plan.py: no plan with the proxy = a plain decode round)."""
        if pp_proxy_tensors is not None:
            return plan_from_wire(pp_proxy_tensors.tensors, len(batch.reqs)) or plain_plan(len(batch.reqs))
        return self.policy.plan(batch, self.width, self.context_len, self.tp_group)

    def _decode_round(self, batch, on_publish, pp_proxy_tensors=None) -> GenerationBatchResult:
        t0 = time.perf_counter()
        lens, drafts = self._round_plan(batch, pp_proxy_tensors)
        l_max = max(lens)
        if l_max <= 1:
            result, kind, accepted = self._plain_decode(batch, pp_proxy_tensors), "decode", 0
        else:
            result, accepted = self._verify(batch, lens, drafts, pp_proxy_tensors)
            kind = "verify"
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        if self.recorder.path:  # a plain-decode step pays nothing for records nobody asked for
            n_tokens = sum(lens)
            self.recorder.step(kind=kind, n_reqs=len(lens), n_tokens=n_tokens, l_max=l_max,
                               seconds=time.perf_counter() - t0, drafted=n_tokens - len(lens), accepted=accepted)
        return result

    def _plain_decode(self, batch, pp_proxy_tensors=None) -> GenerationBatchResult:
        """One token per request at its committed position (SGLang reserved the slots in req_to_token)."""
        seq = batch.seq_lens
        to_plain_decode(batch, self.req_to_token_pool.req_to_token, self.device)
        res = self._target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors,
                                                           capture_hidden_mode=self._capture_mode())
        if self.capture is not None:
            self.capture.after_one_token(batch.reqs, res.logits_output)
        out = res.logits_output
        if out is not None and out.next_token_logprobs is not None:  # speculative results hold a list per request
            out.next_token_logprobs = out.next_token_logprobs.view(len(batch.reqs), 1)
        return self._one_token_result(res, seq + 1, decode=True)

    def _accept(self, batch, logits, ids, lens: list[int], seq_lens) -> tuple[list[int], list[list[int]]]:
        """(commit_lens [B], emitted tokens per request) of a verify step: greedy when every request is greedy,
        else rejection sampling for the sampled requests (drawn on TP rank 0, so every rank commits the same)."""
        info = batch.sampling_info
        if info is None or info.is_all_greedy:
            return accept_greedy(torch.argmax(logits, -1), ids, lens)
        out = accept_sampled(logits, ids, lens, batch.reqs, info, list(seq_lens), self.policy.sampling_backend)
        if self.tp_group.world_size > 1:
            out = self.tp_group.broadcast_object(out, src=0)
        return out

    def _verify(self, batch, lens: list[int], drafts: list[list[int]],
                pp_proxy_tensors=None) -> tuple[GenerationBatchResult, int]:
        bs = len(batch.reqs)
        spec = to_verify(batch, self.req_to_token_pool.req_to_token, lens, drafts, self.width, self.device)
        ids = batch.input_ids
        res = self._target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True,
                                                           capture_hidden_mode=self._capture_mode(verify=True))
        logits = res.logits_output.next_token_logits
        if logits.shape[0] != spec.layout.num_tokens:
            raise RuntimeError(f"K3_CSV verify: {logits.shape[0]} logit rows for {spec.layout.num_tokens} verified "
                               "tokens")
        commit_lens, outs = self._accept(batch, logits, ids, lens, spec.layout.seq_lens)
        accept_lens = torch.tensor(commit_lens, dtype=torch.int32, device=self.device)
        accept_index = commit_after_verify(self._target_worker, batch, accept_lens, self.width)
        self.policy.observe(batch.reqs, lens, commit_lens)
        if self.capture is not None:
            self.capture.after_verify(batch.reqs, res.logits_output, lens, commit_lens)
        next_ids = torch.zeros(bs, self.width, dtype=torch.int32)
        for i, out in enumerate(outs):
            next_ids[i, : len(out)] = torch.tensor(out, dtype=torch.int32)
        bonus = torch.tensor([out[-1] for out in outs], dtype=torch.int64, device=self.device)
        next_ids = next_ids.flatten().to(self.device)
        new_seq_lens = batch.seq_lens + accept_lens.to(batch.seq_lens.dtype)
        state = draft_state(self.width, new_seq_lens, next_ids, accept_lens, bonus)
        result = GenerationBatchResult(
            logits_output=res.logits_output, next_token_ids=next_ids, can_run_cuda_graph=False,
            accept_lens=accept_lens, new_seq_lens=new_seq_lens, next_draft_input=state,
            speculative_num_draft_tokens=self.width, accept_index=accept_index)
        return result, sum(commit_lens) - bs
