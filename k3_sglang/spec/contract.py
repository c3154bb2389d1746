"""SGLang's verify contract, the only interface K3_CSV uses to the model's recurrent (KDA) state.

SGLang 0.5.23 verifies drafts of a hybrid model (EAGLE, DSpark) in two moves, and K3_CSV makes the same two:

1. A TARGET_VERIFY forward. Each KDA layer leaves its pools as they were and writes the state and conv window after
   every verified token into the mamba pool's per-draft scratch (`MambaPool.SpeculativeState.intermediate_ssm`
   [layers, R, N, ...] and `intermediate_conv_window`), request b at row `select_verify_intermediate_state_indices`
   (row b; under pipeline speculation the request's req-pool row). SGLang's own KDA backend does this
   (`kda_backend.KDAAttnBackend._forward_target_verify`; on CPU with our kernel, k3_sglang/sglang_cpu), and so does
   the portable model's KDA layer (k3_sglang/model/kda_layer.py).
2. After acceptance, SGLang's commit (`spec_utils.commit_mamba_states_after_verify` ->
   `HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`) copies each request's accepted step (accept length
   - 1) from the scratch into its slot (and, with the extra_buffer prefix cache, the interval-crossing step into its
   track slot). Under `--pp-size N` SGLang's relay makes every earlier stage run the same commit from the relayed
   accept index (`SchedulerPPMixin._pp_spec_commit_relayed_accept`).

MLA needs no commit: a chain's accepted rows already sit in their final KV slots. SGLang's scatter is a Triton kernel
that refuses CPU tensors, so on our CPU platform `scatter_after_verify` (an AROUND hook of
`scatter_mamba_states_after_mtp_verify`) performs the same copies in torch.
"""
from __future__ import annotations

import torch

SCATTER_TARGET = "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify"


def chain_accept_index(accept_lens: torch.Tensor, width: int) -> torch.Tensor:
    """SGLang's accept_index for chains: accept_lens [B] (accepted drafts + 1) -> [B, width] int64 whose entry
    (b, j) is the dense verify row b * width + j for j < accept_lens[b], else -1."""
    bs = accept_lens.shape[0]
    steps = torch.arange(width, device=accept_lens.device)[None, :]
    rows = torch.arange(bs, device=accept_lens.device)[:, None] * width + steps
    return torch.where(steps < accept_lens.to(torch.int64)[:, None], rows, torch.full_like(rows, -1))


def commit_after_verify(target_worker, batch, accept_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Commit a TARGET_VERIFY forward's accepted steps through SGLang (step 2 above) and return the accept_index it
    was given ([B, width], for the pipeline relay). batch: the ScheduleBatch of the verify (committed seq_lens,
    req_pool_indices, mamba_track_indices); accept_lens [B] >= 1; width: SGLang's speculative_num_draft_tokens."""
    from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify

    accept_index = chain_accept_index(accept_lens, width)
    commit_mamba_states_after_verify(target_worker, batch, accept_lens, accept_index, width)
    return accept_index


def _scatter(dst: torch.Tensor, src: torch.Tensor, dst_rows: torch.Tensor, steps: torch.Tensor,
             src_rows: torch.Tensor) -> None:
    """dst [layers, slots, ...][:, dst_rows[i]] = src [layers, R, N, ...][:, src_rows[i], steps[i]] where steps[i] >= 0
    and dst_rows[i] >= 0 (SGLang's masked scatter)."""
    ok = (steps >= 0) & (dst_rows >= 0) & (steps < src.shape[2]) & (dst_rows < dst.shape[1])
    if not bool(ok.any()):
        return
    dst[:, dst_rows[ok].long()] = src[:, src_rows[ok].long(), steps[ok].long()].to(dst.dtype)


def scatter_after_verify(original, mamba_caches, state_indices_tensor, last_correct_step_indices,
                         mamba_track_indices, mamba_steps_to_track, src_indices_raw=None, *args, **kwargs):
    """AROUND `scatter_mamba_states_after_mtp_verify`: for CPU pools the same copies in torch (recurrent state and
    every conv window of the accepted step into each request's slot, and the interval-crossing step into its track
    slot); SGLang's Triton kernels for any other device.

    mamba_caches: SpeculativeState (temporal [layers, slots, ...], intermediate_ssm [layers, R, N, ...], conv and
    intermediate_conv_window lists alike); state_indices_tensor / last_correct_step_indices [B]; scratch row of
    request i = src_indices_raw[i] (default i)."""
    if mamba_caches.temporal.device.type != "cpu" or args or kwargs:
        return original(mamba_caches, state_indices_tensor, last_correct_step_indices, mamba_track_indices,
                        mamba_steps_to_track, src_indices_raw, *args, **kwargs)
    bs = last_correct_step_indices.shape[0]
    src_rows = torch.arange(bs) if src_indices_raw is None else src_indices_raw[:bs].cpu()
    commits = [(state_indices_tensor[:bs].cpu(), last_correct_step_indices.cpu())]
    if mamba_track_indices is not None:
        if mamba_steps_to_track is None:
            raise ValueError("scatter_after_verify: mamba_track_indices without mamba_steps_to_track")
        commits.append((mamba_track_indices[:bs].cpu(), mamba_steps_to_track.cpu()))
    pairs = [(mamba_caches.temporal, mamba_caches.intermediate_ssm)]
    pairs += list(zip(mamba_caches.conv, mamba_caches.intermediate_conv_window))
    for dst_rows, steps in commits:
        for dst, src in pairs:
            if dst is not None and src is not None and dst.numel():
                _scatter(dst, src, dst_rows, steps, src_rows)
