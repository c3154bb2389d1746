"""What SGLang's own K3 (`sglang.srt.models.kimi_k3`) cannot serve on the k3_cpu platform, refused before any server
starts (`k3 serve` with K3_MODEL_IMPL=sglang on a host without CUDA; serving/launch.py checks the parsed ServerArgs
again).

On CPU SGLang's K3 runs with what our general plugin `k3_sglang_k3_cpu` supplies (k3_sglang/sglang_cpu): the
`k3_cpu_mla` attention backend (`k3_dcp_mla` under `--dcp-size > 1`, k3_sglang/dcp_mla), a torch KDA kernel inside
SGLang's KDA backend, a MoE runner core for the "triton" runner name. Everything else SGLang would pick (GPU attention, KDA and MoE backends, CUDA graphs, torch.compile,
quantized KV, SGLang's own speculative workers, DP attention) has no CPU path and would fail deep inside a rank, so each is named
here with the flag that asks for it. The checks read SGLang's own argument names (its parsed command line or a
ServerArgs), as serving/portable_limits.py does for the portable model.
"""

from __future__ import annotations

from k3_sglang.serving.portable_limits import GRAPH_PHASES, ParallelLimit, graph_backend
from k3_sglang.dcp_mla import BACKEND_NAME as DCP_ATTENTION_BACKEND
from k3_sglang.sglang_cpu import MLA_BACKEND_NAME as ATTENTION_BACKEND
# SGLang field -> limit. Raise `supported` when a size has an end-to-end test on CPU.
SUPPORTED_PARALLEL_SIZES: dict[str, ParallelLimit] = {
    "tp_size": ParallelLimit("--tp-size", 2, "tensor parallelism", "tested at 2 ranks on CPU"),
    "pp_size": ParallelLimit("--pp-size", 2, "pipeline parallelism", "tested at 2 stages on CPU"),
    "dcp_size": ParallelLimit("--dcp-size", 2, "decode context parallelism",
                              "tested at 2 ranks on CPU, on the k3_dcp_mla backend"),
    "attn_dp_size": ParallelLimit("--attn-dp-size", 1, "DP attention", "no CPU path"),
    "attn_cp_size": ParallelLimit("--attn-cp-size", 1, "attention context parallelism", "no CPU path"),
    "ep_size": ParallelLimit("--ep-size", 2, "expert parallelism", "tested at 2 ranks on CPU"),
    "moe_dp_size": ParallelLimit("--moe-dp-size", 1, "MoE data parallelism", "no CPU path"),
    "dp_size": ParallelLimit("--dp-size", 1, "data-parallel replicas", "not tested on CPU"),
}
# SGLang field -> (flag, values served on CPU, why). None stands for "SGLang's default".
ALLOWED_VALUES: dict[str, tuple[str, tuple, str]] = {
    "attention_backend": ("--attention-backend", (None, ATTENTION_BACKEND, DCP_ATTENTION_BACKEND),
                          f"K3's MLA runs on the {ATTENTION_BACKEND} or {DCP_ATTENTION_BACKEND} backend on CPU"),
    "decode_attention_backend": ("--decode-attention-backend", (None, ATTENTION_BACKEND, DCP_ATTENTION_BACKEND),
                                 f"K3's MLA runs on the {ATTENTION_BACKEND} or {DCP_ATTENTION_BACKEND} backend on "
                                 "CPU"),
    "prefill_attention_backend": ("--prefill-attention-backend", (None, ATTENTION_BACKEND, DCP_ATTENTION_BACKEND),
                                  f"K3's MLA runs on the {ATTENTION_BACKEND} or {DCP_ATTENTION_BACKEND} backend on "
                                  "CPU"),
    "mamba_radix_cache_strategy": ("--mamba-radix-cache-strategy", ("no_buffer", "extra_buffer"),
                                   "extra_buffer_lazy is not exercised on CPU"),
    "dcp_comm_backend": ("--dcp-comm-backend", (None, "ag_rs", "a2a"),
                         "fi_a2a needs FlashInfer's MNNVL all-to-all (Blackwell)"),
    "linear_attn_backend": ("--linear-attn-backend", (None, "triton"),
                            "the CPU KDA kernel takes the place of SGLang's triton KDA kernel"),
    "linear_attn_decode_backend": ("--linear-attn-decode-backend", (None, "triton"),
                                   "the CPU KDA kernel takes the place of SGLang's triton KDA kernel"),
    "linear_attn_prefill_backend": ("--linear-attn-prefill-backend", (None, "triton"),
                                    "the CPU KDA kernel takes the place of SGLang's triton KDA kernel"),
    "linear_attn_verify_backend": ("--linear-attn-verify-backend", (None, "triton"),
                                   "the CPU KDA kernel takes the place of SGLang's triton KDA kernel"),
    "moe_runner_backend": ("--moe-runner-backend", (None, "auto", "triton"),
                           "the CPU MoE runner core serves SGLang's triton runner name"),
    "moe_a2a_backend": ("--moe-a2a-backend", (None, "none"), "no all-to-all on CPU"),
    "kv_cache_dtype": ("--kv-cache-dtype", (None, "auto"), "the CPU MLA backend keeps the model dtype"),
    "dtype": ("--dtype", (None, "auto", "bfloat16", "float32"), "float16 has no tested CPU path"),
    "disaggregation_mode": ("--disaggregation-mode", (None, "null", "prefill", "decode"),
                            "PD runs over Mooncake TCP on CPU (tests/e2e/test_spec_pd_slow.py)"),
    "speculative_algorithm": ("--speculative-algorithm", (None, "K3_CSV"),
                              "SGLang's own speculative workers (EAGLE, DSpark, NGRAM) have no CPU path; K3_CSV runs "
                              "on SGLang's verify contract there (docs/spec.md)"),
}
# SGLang boolean fields that must stay off: flag, why.
MUST_BE_OFF: dict[str, tuple[str, str]] = {
    "enable_dp_attention": ("--enable-dp-attention", "no CPU path"),
    "enable_torch_compile": ("--enable-torch-compile", "the CPU kernels run eagerly"),
    "enable_linear_replayssm": ("--enable-linear-replayssm", "ReplaySSM has no CPU kernel"),
    "enable_two_batch_overlap": ("--enable-two-batch-overlap", "no CPU path"),
    "enable_single_batch_overlap": ("--enable-single-batch-overlap", "no CPU path"),
    "enable_unified_memory": ("--enable-unified-memory", "not tested on CPU"),
}


def _value(args, field: str):
    value = getattr(args, field, None)
    return getattr(value, "value", value)  # enums (e.g. a resolved backend) compare by their string value


def refusals(args) -> list[str]:
    """Every reason SGLang's K3 cannot serve `args` (SGLang argument names) on the k3_cpu platform."""
    reasons = []
    for field, limit in SUPPORTED_PARALLEL_SIZES.items():
        size = getattr(args, field, 1)
        if size is not None and int(size) > limit.supported:
            reasons.append(f"{limit.flag} {size}: {limit.what} with SGLang's K3 on CPU (supported: "
                           f"{limit.supported}; {limit.why})")
    for field, (flag, allowed, why) in ALLOWED_VALUES.items():
        value = _value(args, field)
        if value not in allowed:
            shown = ", ".join(str(a) for a in allowed if a is not None) or "none"
            reasons.append(f"{flag} {value}: {why} (served: {shown})")
    if (int(getattr(args, "dcp_size", 1) or 1) > 1 and _value(args, "mamba_radix_cache_strategy") == "no_buffer"
            and not getattr(args, "disable_radix_cache", False)):
        reasons.append("--mamba-radix-cache-strategy no_buffer under --dcp-size > 1: DCP's radix pages hold "
                       "page_size x dcp tokens and need the extra_buffer KDA snapshots (k3 serve's default there), "
                       "or --disable-radix-cache")
    if _value(args, "speculative_algorithm") == "K3_CSV":
        from k3_sglang.serving.portable_limits import spec_refusals

        reasons += spec_refusals(args, portable=False)
    if not getattr(args, "disable_overlap_schedule", False):
        reasons.append("the overlap scheduler: SGLang's K3 on CPU runs with --disable-overlap-schedule (k3 serve's "
                       "default; the no_buffer KDA prefix cache needs it)")
    for field, (flag, why) in MUST_BE_OFF.items():
        if getattr(args, field, False):
            reasons.append(f"{flag}: {why}")
    for phase in GRAPH_PHASES:
        backend = graph_backend(args, phase)
        if backend != "disabled":
            shown = backend or "SGLang's default: on"
            reasons.append(f"CUDA graphs for {phase} ({shown}): SGLang's K3 runs eagerly on CPU "
                           f"(--cuda-graph-backend-{phase} disabled, k3 serve's default there)")
    return reasons


def refusal_message(reasons: list[str]) -> str:
    lines = "\n".join(f"  - {r}" for r in reasons)
    return (f"SGLang's K3 (K3_MODEL_IMPL=sglang) cannot serve this configuration on the k3_cpu platform:\n{lines}\n"
            "Unset K3_MODEL_IMPL to serve the portable model on CPU, or run on a CUDA host.")
