"""SGLang's verify contract, the only interface K3_CSV uses to the model's recurrent (KDA) state.

SGLang 0.5.23 verifies drafts of a hybrid model (EAGLE, DSpark) in two moves, and K3_CSV makes the same two:

1. A TARGET_VERIFY forward. Each KDA layer leaves its pools as they were and writes the state and conv window after
   every verified token into the mamba pool's per-draft scratch (`MambaPool.SpeculativeState.intermediate_ssm`
   [layers, R, N, ...] and `intermediate_conv_window`), request b at row `select_verify_intermediate_state_indices`
   (row b; under pipeline speculation the request's req-pool row). SGLang's own KDA backend does this
   (`kda_backend.KDAAttnBackend._forward_target_verify`; on CPU with our kernel, k3_sglang/sglang_cpu).
2. After acceptance, SGLang's commit (`spec_utils.commit_mamba_states_after_verify` ->
   `HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`) copies each request's accepted step (accept length
   - 1) from the scratch into its slot (and, with the extra_buffer prefix cache, the interval-crossing step into its
   track slot). Under `--pp-size N` SGLang's relay makes every earlier stage run the same commit from the relayed
   accept index (`SchedulerPPMixin._pp_spec_commit_relayed_accept`).

MLA needs no commit: a chain's accepted rows already sit in their final KV slots. SGLang's scatter is a Triton kernel
that refuses CPU tensors, so on our CPU platform `scatter_after_verify` (an AROUND hook of
`scatter_mamba_states_after_mtp_verify`) performs the same copies in torch.

Who honours the contract (`contract_refusals`, checked before any server starts): a K3 checkpoint (its
config.json's `architectures`), served by SGLang's K3 with an MLA attention backend whose TARGET_VERIFY reads SGLang's ragged verify layout (a K3_CSV step verifies chains of
different lengths). Anything else is refused with the reason.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch


SCATTER_TARGET = "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify"
# The architectures whose SGLang model classes (ours and SGLang's kimi_k3 EntryClass) verify into the contract.
K3_ARCHITECTURES = ("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM")
# SGLang's K3: MLA attention backends whose TARGET_VERIFY metadata reads `spec_info.ragged_verify_layout`
# (k3_cpu_mla and k3_dcp_mla: ours, end to end on CPU in tests/e2e/test_spec_serve.py, k3_dcp_mla through
# dcp_mla/metadata.py's verify_lengths; the GPU ones by their source in SGLang
# 0.5.23, flashinfer_mla_backend.py, trtllm_mla_backend.py, flashattention_backend.py: not run here). None = the
# backend SGLang picks for K3.
RAGGED_VERIFY_MLA_BACKENDS = (None, "k3_cpu_mla", "k3_dcp_mla", "flashinfer", "trtllm_mla", "fa3")
ATTENTION_BACKEND_FIELDS = (("attention_backend", "--attention-backend"),
                            ("decode_attention_backend", "--decode-attention-backend"))


def model_architectures(model_path) -> list[str] | None:
    """The `architectures` of a local checkpoint's config.json, or None when model_path is no local folder (a hub
    id: the worker checks the loaded config, `check_loaded_model`)."""
    path = Path(str(model_path)) if model_path else None
    if path is None or not path.is_dir():
        return None
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return []
    return [str(a) for a in data.get("architectures") or []]


def _architecture_refusal(architectures: list[str], where: str) -> list[str]:
    if any(a in K3_ARCHITECTURES for a in architectures):
        return []
    shown = ", ".join(architectures) or "none"
    return [f"--speculative-algorithm K3_CSV with {where} (architectures: {shown}): K3_CSV verifies through SGLang's "
            f"hybrid KDA verify contract, which only K3 models implement here ({', '.join(K3_ARCHITECTURES)})"]


def contract_refusals(args) -> list[str]:
    """Every reason this server's model or backend does not honour the verify contract (SGLang argument names:
    model_path, attention_backend, decode_attention_backend); empty when it does."""
    path = getattr(args, "model_path", None)
    architectures = model_architectures(path)
    reasons = [] if architectures is None else _architecture_refusal(architectures, f"--model-path {path}")
    for field, flag in ATTENTION_BACKEND_FIELDS:
        value = getattr(args, field, None)
        value = getattr(value, "value", value)
        if value not in RAGGED_VERIFY_MLA_BACKENDS:
            shown = ", ".join(b for b in RAGGED_VERIFY_MLA_BACKENDS if b)
            reasons.append(f"--speculative-algorithm K3_CSV with {flag} {value}: its TARGET_VERIFY does not read "
                           f"SGLang's ragged verify layout, and K3_CSV verifies chains of different lengths "
                           f"(served with SGLang's K3: {shown})")
    return reasons + draft_refusals(args)


def draft_refusals(args, environ=None) -> list[str]:
    """Why K3_SPEC_DRAFTER=checkpoint cannot serve this command line (empty for other drafters): a bad draft
    checkpoint (config.json, tensor names and shapes), one that does not fit the target's config (hidden size,
    vocabulary, target_layer_ids), or a pipeline (the target's hidden states are captured on a whole-model rank)."""
    from k3_sglang.spec.settings import SpecSettings

    try:
        spec = SpecSettings.from_env(environ)
    except ValueError:
        return []  # reported by the settings' own check
    if spec.drafter != "checkpoint" or not spec.draft_path or not os.path.isdir(spec.draft_path):
        return []
    from k3_sglang.spec.drafters.draft_checkpoint import check_draft_files, target_mismatches

    try:
        config = check_draft_files(spec.draft_path)
    except ValueError as exc:
        return [f"K3_SPEC_DRAFT_PATH: {exc}"]
    reasons = []
    pp = int(getattr(args, "pp_size", 1) or 1)
    if pp > 1:
        reasons.append(f"K3_SPEC_DRAFTER=checkpoint with --pp-size {pp}: the draft reads the target's hidden states, "
                       "captured on a rank that runs the whole model (no pipeline yet)")
    target = _target_shapes(getattr(args, "model_path", None))
    if target is not None:
        reasons += [f"K3_SPEC_DRAFT_PATH {spec.draft_path}: {m}" for m in target_mismatches(config, *target)]
    return reasons


def _target_shapes(model_path) -> tuple[int, int, int] | None:
    """(hidden_size, vocab_size, num_layers) of a local K3 checkpoint, None when it is no readable local K3."""
    path = Path(str(model_path)) if model_path else None
    if path is None or not (path / "config.json").is_file():
        return None
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    try:
        return int(text["hidden_size"]), int(text["vocab_size"]), int(text["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return None


def check_loaded_model(model_config) -> None:
    """Raise ValueError when the model a K3_CSV worker was given is no K3 (a hub id escapes contract_refusals)."""
    hf = getattr(model_config, "hf_config", None)
    reasons = _architecture_refusal([str(a) for a in getattr(hf, "architectures", None) or []], "this model")
    if reasons:
        raise ValueError(reasons[0])


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
