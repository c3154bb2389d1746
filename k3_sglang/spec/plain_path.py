"""K3_CSV's plain path: a decode step the policy runs as plain decode takes SGLang's own non-speculative path.

Without it every decode step of a K3_CSV server goes through SGLang's speculative scheduling path whatever the plan:
its decode preparation (a KV reserve of 2 x chain width past each request's committed length, re-topped every
step), the forward isolation of the V2 schema (a snapshot and restore of the ScheduleBatch's fields) and its result
path. A step that K3_CSV already knows will be plain decode costs more than a no-spec step by that much
(docs/bench-plain-decode.md).

The seam is one AROUND hook of `Scheduler.update_running_batch`, the call that prepares the running batch for its
next decode step. Before SGLang prepares it, the worker's policy says whether the step will be plain decode without
planning (`StepPolicy.plain_ahead`: the `decode` verify mode, a batch holding a request K3_CSV cannot verify, or a
settled compact policy between its probes). Then:

- plain: the batch's `spec_algorithm` becomes SGLang's NONE for this step, so SGLang prepares it (`alloc_for_decode`,
  one slot per request), runs it (the scheduler's non-speculative branch, no isolation) and processes its result
  (one token per request) exactly as a server without speculation does. The worker's `forward_batch_generation`
  sees a NONE batch and runs the target forward only (spec/worker.py). Switching from speculative steps first gives
  back each request's KV reserve past its committed length (`release_reserve`), since SGLang's non-speculative
  allocator writes the slot at the committed length itself;
- otherwise (a verify step or a probe): the batch gets K3_CSV back and SGLang's speculative preparation re-reserves.

Between modes only the running batch's algorithm, its `spec_info` (the draft state, rebuilt by the next speculative
step; K3_CSV's decode round reads the requests' own tokens) and the KV reserve change; `seq_lens` equal each
request's committed length after any step of either mode. Served where one scheduler decides alone and pages are
single tokens (`plain_path_refusal`): TP/PP/DP 1, no PD, page size 1, no checkpoint drafter (its root features come
from the worker's own forward), no forced verify length, no `extra_buffer` KDA tracking, overlap off. Elsewhere the
worker keeps running plain steps on the speculative path, as before.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

UPDATE_TARGET = "sglang.srt.managers.scheduler.Scheduler.update_running_batch"

_OWNER = None  # the K3SpecWorker of this scheduler process that takes the plain path (None: hook inert)


def plain_path_refusal(server_args, settings) -> str | None:
    """Why this server keeps its plain steps on SGLang's speculative path, or None when it may take the plain path."""
    if not settings.plain_path:
        return "K3_SPEC_PLAIN_PATH=0"
    for name in ("tp_size", "pp_size", "dp_size"):
        if int(getattr(server_args, name, 1) or 1) != 1:
            return f"--{name.replace('_', '-')} > 1 (every rank's scheduler would have to agree on each step's mode)"
    if str(getattr(server_args, "disaggregation_mode", "null") or "null") != "null":
        return "PD disaggregation"
    if int(getattr(server_args, "page_size", 1) or 1) != 1:
        return "--page-size > 1 (the KV reserve is given back per token)"
    if not getattr(server_args, "disable_overlap_schedule", True):
        return "overlap scheduling"
    if _mamba_extra_buffer():
        return "the extra_buffer KDA prefix cache"
    if settings.drafter == "checkpoint":
        return "the checkpoint drafter (it reads root features from the worker's own forwards)"
    if settings.force_verify_len is not None:
        return "K3_SPEC_FORCE_VERIFY_LEN"
    return None


def _mamba_extra_buffer() -> bool:
    """SGLang's resolved KDA prefix-cache strategy tracks states in extra buffers (read from its runtime context,
    published before workers start; False where there is none, as in unit tests)."""
    try:
        from sglang.srt.runtime_context import get_exec

        return bool(get_exec().mamba.enable_mamba_extra_buffer)
    except Exception:  # no runtime context in this process
        return False


def take_plain_path(worker) -> None:
    """Make `worker` the owner of this process's plain path (None: give it up)."""
    global _OWNER
    _OWNER = worker


def owner():
    return _OWNER


def release_reserve(batch) -> int:
    """Give back every request's KV slots past its committed length (SGLang's speculative reserve) so that SGLang's
    non-speculative allocator may write the slot at the committed length; returns the slots freed. Requests that
    hold no KV row (finished, retracted) are left alone."""
    tree_cache = batch.tree_cache
    freed = 0
    for req in batch.reqs:
        kv = req.kv
        if not kv.holds_kv or req.finished() or kv.kv_allocated_len <= kv.kv_committed_len:
            continue
        tree_cache.free_kv_row(kv, [(kv.kv_committed_len, kv.kv_allocated_len)])
        freed += kv.kv_allocated_len - kv.kv_committed_len
        kv.kv_allocated_len = kv.kv_committed_len
    return freed


def to_plain(batch, worker) -> None:
    """Let SGLang run the batch's next decode step as a server without speculation does."""
    if batch.spec_algorithm.is_none():
        return
    worker.spec_algorithm = batch.spec_algorithm
    release_reserve(batch)
    batch.spec_algorithm = _none()
    batch.spec_info = None
    batch.orig_seq_lens = batch.seq_lens.clone()  # SGLang's non-speculative prepare advances both together


def to_speculative(batch, worker) -> None:
    """Give the batch K3_CSV back (SGLang's speculative preparation re-reserves each request's KV)."""
    if batch.spec_algorithm.is_none() and worker.spec_algorithm is not None:
        batch.spec_algorithm = worker.spec_algorithm
        batch.spec_info = None


def _none():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.NONE


def update_running_batch(original, scheduler, batch, *args, **kwargs):
    """AROUND `Scheduler.update_running_batch`: choose the step's path before SGLang prepares the decode batch."""
    worker = _OWNER
    if worker is None or batch is None or batch.is_empty() or args or kwargs:
        return original(scheduler, batch, *args, **kwargs)
    plain = worker.policy.plain_ahead(batch)
    if plain:
        to_plain(batch, worker)
    else:
        to_speculative(batch, worker)
    out = original(scheduler, batch)
    if plain and out is not None and not out.is_empty():
        count_plain_step(scheduler, out)
    return out


def count_plain_step(scheduler, batch) -> None:
    """A plain step still counts in a speculative server's metrics as the speculative path counted it (one
    forward, one token per request: SGLang's spec accept-length log, which divides by the forwards it saw, and each
    request's `spec_verify_ct`, from which meta_info's spec_accept_length comes)."""
    n = len(batch.reqs)
    for req in batch.reqs:
        req.spec_verify_ct += 1
    scheduler.metrics_reporter.update_spec_metrics(n, 0, num_accept_tokens=n)


def installed_hooks():
    """(target, hook, hook type name) of the plain path (registered with K3_CSV's other hooks, spec/plugin.py)."""
    return [(UPDATE_TARGET, update_running_batch, "AROUND")]
