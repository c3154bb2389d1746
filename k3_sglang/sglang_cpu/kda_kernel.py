"""The CPU kernel behind SGLang's KDA backend: `K3CpuKDAKernel`, plugged into its `KDAKernelDispatcher`.

SGLang's `KDAAttnBackend` keeps all of its own logic (pool views, prefix-cache track snapshots, verify scratch) and
calls a `LinearAttnKernelBase` for the recurrence; on k3_cpu the dispatcher's Triton kernel is swapped for this
one (hooks.py). It subclasses SGLang's TritonKDAKernel only because the dispatcher checks `isinstance(...,
TritonKDAKernel)` before handing it K3's safe gate (lower_bound); every method is overridden.
"""
from __future__ import annotations

import torch
from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel

from k3_sglang.sglang_cpu import kda_ops


class K3CpuKDAKernel(TritonKDAKernel):
    """decode / extend / target_verify over SGLang's pools in torch (see kda_ops for layouts)."""

    supports_packed_decode = False
    supports_fused_chain_verify = False
    supports_track_state_snapshot = True
    uses_state_checkpoints = False

    def packed_decode(self, *args, **kwargs):
        raise NotImplementedError("K3CpuKDAKernel has no packed decode (supports_packed_decode is False)")

    def decode(self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices, query_start_loc,
               lower_bound=None, **kwargs) -> torch.Tensor:
        """q, k [1, B, H, K], v [1, B, H, V] (after the conv), a [B, H*K], b [1, B, H] -> o [1, B, H, V]."""
        return kda_ops.kda_recurrent(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                                     ssm_states=ssm_states, cache_indices=cache_indices,
                                     query_start_loc=query_start_loc)

    def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
                      intermediate_states_buffer, intermediate_state_indices, cache_steps, retrieve_parent_token,
                      lower_bound=None, **kwargs) -> torch.Tensor:
        """Chain verify: every request's draft tokens from its committed state; the state after each token goes to
        intermediate_states_buffer[intermediate_state_indices[i], t]; the committed pool is not written."""
        if retrieve_parent_token is not None:
            raise NotImplementedError("KDA tree verify (retrieve_parent_token) has no CPU path; use chain drafts")
        if kwargs.get("cache_ring"):
            raise NotImplementedError("KDA ReplaySSM ring verify has no CPU path")
        return kda_ops.kda_recurrent(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                                     ssm_states=ssm_states, cache_indices=cache_indices,
                                     query_start_loc=query_start_loc, write_state=False,
                                     intermediate_states=intermediate_states_buffer,
                                     intermediate_state_indices=intermediate_state_indices)

    def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, A_log=None, dt_bias=None,
               lower_bound=None, beta_is_raw=False, return_intermediate_states=False, **kwargs):
        """q, k [1, T, H, K], v [1, T, H, V], g raw gate [1, T, H, K], beta raw [1, T, H] -> o [1, T, H, V]
        (and h [1, NT, H, V, K] with return_intermediate_states)."""
        if A_log is None or not beta_is_raw:
            raise NotImplementedError("K3CpuKDAKernel.extend takes the raw gate and beta (A_log given, "
                                      "beta_is_raw=True), as SGLang's KDA backend passes them")
        return kda_ops.kda_extend(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
                                  ssm_states=ssm_states, cache_indices=cache_indices,
                                  query_start_loc=query_start_loc, return_chunk_states=return_intermediate_states,
                                  track_state=kwargs.get("track_state"),
                                  track_chunk_idx=kwargs.get("track_chunk_idx"))
