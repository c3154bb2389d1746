"""The model-override hook that gives SGLang's K3 the `k3_dcp_mla` backend under `--dcp-size > 1`.

SGLang 0.5.23's K3 override provider (`arg_groups/model_overrides/kimi_k3.py::_kimi_k3_overrides`) accepts only the
`cutedsl_mla` (Blackwell SM100) or `aiter` (ROCm) decode backends under DCP and raises AssertionError for any other.
Our AROUND hook on `collect_model_override_declarations` (the name SGLang's model hook bound) swaps that provider,
for the one call, for `kimi_k3_dcp_overrides`, which
- on non-Blackwell CUDA, and on the k3_cpu platform, declares `k3_dcp_mla` the decode backend (and the prefill one
  unless `--prefill-attention-backend` names another), plus what SGLang's own DCP branch declares for K3
  (`enable_symm_mem` off; the replicated Q projection for the a2a merges);
- hands everything else to SGLang's provider unchanged: DCP 1, ROCm, and Blackwell unless the decode backend
  asked for is `k3_dcp_mla`.
"""
from __future__ import annotations

from k3_sglang.dcp_mla import BACKEND_NAME

K3_ARCHITECTURES = ("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM")
SGLANG_PROVIDER = "_kimi_k3_overrides"
OVERRIDES_TARGET = "sglang.srt.arg_groups.model_hook.collect_model_override_declarations"
# Decode backends SGLang's K3 DCP path serves itself (its provider checks their kernels).
SGLANG_DCP_DECODE_BACKENDS = ("cutedsl_mla", "aiter")


def uses_k3_dcp_mla(decode_backend: str | None, *, cuda: bool, hip: bool, sm100: bool) -> bool:
    """Whether a K3 DCP server takes k3_dcp_mla, given the decode backend asked for (None: unset) and the platform
    (neither cuda nor hip: the k3_cpu platform)."""
    if decode_backend == BACKEND_NAME:
        return True
    if hip:
        return False
    if not cuda:
        return True
    if sm100:
        return False  # Blackwell keeps SGLang's cutedsl_mla default (or its refusal of another backend)
    return decode_backend not in SGLANG_DCP_DECODE_BACKENDS


def dcp_declarations(cfg, on_cpu: bool) -> dict:
    """What a K3 DCP server on k3_dcp_mla declares (cfg: SGLang's resolving view)."""
    out: dict = {"decode_attention_backend": BACKEND_NAME}
    if on_cpu or not cfg.prefill_attention_backend:
        out["prefill_attention_backend"] = BACKEND_NAME
    if on_cpu:
        out["attention_backend"] = BACKEND_NAME
    if cfg.enable_symm_mem:
        out["enable_symm_mem"] = False
    if cfg.speculative_algorithm is not None:
        out["speculative_attention_mode"] = "decode"  # verify on this backend's DCP target-verify path
    if cfg.dcp_replicate_q_proj is None and cfg.dcp_comm_backend in ("a2a", "fi_a2a"):
        out["dcp_replicate_q_proj"] = True
    return out


def kimi_k3_dcp_overrides(sglang_provider, server_args, hf_config) -> dict:
    """SGLang's K3 provider with the k3_dcp_mla choice in front of its DCP branch."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of, resolving_view
    from sglang.srt.runtime_context import get_platform

    cfg = resolving_view(server_args)
    if cfg.dcp_size <= 1:
        return sglang_provider(server_args, hf_config)
    platform = get_platform()
    cuda, hip = bool(platform.is_cuda), bool(platform.is_hip)
    _, decode = attention_backends_of(cfg)
    if not uses_k3_dcp_mla(decode, cuda=cuda, hip=hip, sm100=bool(cuda and platform.is_sm100)):
        return sglang_provider(server_args, hf_config)
    return dcp_declarations(cfg, on_cpu=not (cuda or hip))


def collect_overrides_with_k3_dcp_mla(original, *args, **kwargs):
    """AROUND hook: SGLang's override collection (architecture, server_args, hf_config) with SGLang's K3 provider
    wrapped by kimi_k3_dcp_overrides for the call."""
    from sglang.srt.arg_groups import model_override_base

    architecture = args[0] if args else kwargs.get("architecture")
    providers = model_override_base._MODEL_OVERRIDE_FNS.get(architecture)
    if architecture not in K3_ARCHITECTURES or not providers:
        return original(*args, **kwargs)
    saved = list(providers)
    providers[:] = [_wrapped(fn) if getattr(fn, "__name__", "") == SGLANG_PROVIDER else fn for fn in saved]
    try:
        return original(*args, **kwargs)
    finally:
        providers[:] = saved


def _wrapped(sglang_provider):
    def _kimi_k3_overrides(server_args, hf_config):  # SGLang's provider name: its declaration source stays the same
        return kimi_k3_dcp_overrides(sglang_provider, server_args, hf_config)

    _kimi_k3_overrides.__qualname__ = f"k3_dcp_mla.{SGLANG_PROVIDER}"
    return _kimi_k3_overrides
