"""What SGLang's own K3 (`sglang.srt.models.kimi_k3`) cannot serve on the k3_cpu platform, refused before any server
starts (`k3 serve` on a host without CUDA; serving/launch.py checks the parsed ServerArgs again).

On CPU SGLang's K3 runs with what our general plugin `k3_sglang_k3_cpu` supplies (k3_sglang/sglang_cpu): the
`k3_cpu_mla` attention backend (`k3_dcp_mla` under `--dcp-size > 1`, k3_sglang/dcp_mla), a torch KDA kernel inside
SGLang's KDA backend, a MoE runner core for the "triton" runner name. Everything else SGLang would pick (GPU attention, KDA and MoE backends, CUDA graphs, torch.compile,
quantized KV, SGLang's own speculative workers, DP attention) has no CPU path and would fail deep inside a rank, so each is named
here with the flag that asks for it. TP/EP/DCP, PP, our K3_CSV speculation (`spec_refusals`), PD disaggregation and
HiCache are served. The checks read SGLang's own argument names (its parsed command line or a ServerArgs).

The limits are one table (`limits()`, read by serving/limits_table.py's engine); docs/serving.md's list of them is
generated from it (`python -m k3_sglang.serving.limits_table --write`).
"""

from __future__ import annotations

from k3_sglang.serving.limits_table import AllowedValues, ParallelLimit, PlatformLimits, Rule, table_refusals
from k3_sglang.dcp_mla import BACKEND_NAME as DCP_ATTENTION_BACKEND
from k3_sglang.sglang_cpu import MLA_BACKEND_NAME as ATTENTION_BACKEND
# SGLang field -> limit. Raise `supported` when a size has an end-to-end test on CPU.
SUPPORTED_PARALLEL_SIZES: dict[str, ParallelLimit] = {
    "tp_size": ParallelLimit("--tp-size", 4, "tensor parallelism",
                             "tested up to 4 ranks on CPU (tests/e2e/test_sglang_k3_wide_slow.py)"),
    "pp_size": ParallelLimit("--pp-size", 4, "pipeline parallelism",
                             "tested up to 4 stages on CPU (tests/e2e/test_sglang_k3_wide_slow.py)"),
    "dcp_size": ParallelLimit("--dcp-size", 4, "decode context parallelism",
                              "tested up to 4 ranks on CPU, on the k3_dcp_mla backend"),
    "attn_dp_size": ParallelLimit("--attn-dp-size", 1, "DP attention", "no CPU path"),
    "attn_cp_size": ParallelLimit("--attn-cp-size", 1, "attention context parallelism", "no CPU path"),
    "ep_size": ParallelLimit("--ep-size", 4, "expert parallelism", "tested up to 4 ranks on CPU"),
    "moe_dp_size": ParallelLimit("--moe-dp-size", 1, "MoE data parallelism", "no CPU path"),
    "dp_size": ParallelLimit("--dp-size", 1, "data-parallel replicas", "not tested on CPU"),
}
# SGLang field -> the values served on CPU (None stands for "SGLang's default") and why.
_MLA = (None, ATTENTION_BACKEND, DCP_ATTENTION_BACKEND)
_MLA_WHY = f"K3's MLA runs on the {ATTENTION_BACKEND} or {DCP_ATTENTION_BACKEND} backend on CPU"
_KDA_WHY = "the CPU KDA kernel takes the place of SGLang's triton KDA kernel"
ALLOWED_VALUES: dict[str, AllowedValues] = {
    "attention_backend": AllowedValues("--attention-backend", _MLA, _MLA_WHY),
    "decode_attention_backend": AllowedValues("--decode-attention-backend", _MLA, _MLA_WHY),
    "prefill_attention_backend": AllowedValues("--prefill-attention-backend", _MLA, _MLA_WHY),
    "mamba_radix_cache_strategy": AllowedValues("--mamba-radix-cache-strategy", ("no_buffer", "extra_buffer"),
                                                "extra_buffer_lazy is not exercised on CPU"),
    "dcp_comm_backend": AllowedValues("--dcp-comm-backend", (None, "ag_rs", "a2a"),
                                      "fi_a2a needs FlashInfer's MNNVL all-to-all (Blackwell)"),
    "linear_attn_backend": AllowedValues("--linear-attn-backend", (None, "triton"), _KDA_WHY),
    "linear_attn_decode_backend": AllowedValues("--linear-attn-decode-backend", (None, "triton"), _KDA_WHY),
    "linear_attn_prefill_backend": AllowedValues("--linear-attn-prefill-backend", (None, "triton"), _KDA_WHY),
    "linear_attn_verify_backend": AllowedValues("--linear-attn-verify-backend", (None, "triton"), _KDA_WHY),
    "moe_runner_backend": AllowedValues("--moe-runner-backend", (None, "auto", "triton"),
                                        "the CPU MoE runner core serves SGLang's triton runner name"),
    "moe_a2a_backend": AllowedValues("--moe-a2a-backend", (None, "none"), "no all-to-all on CPU"),
    "kv_cache_dtype": AllowedValues("--kv-cache-dtype", (None, "auto"), "the CPU MLA backend keeps the model dtype"),
    "dtype": AllowedValues("--dtype", (None, "auto", "bfloat16", "float32"), "float16 has no tested CPU path"),
    "disaggregation_mode": AllowedValues("--disaggregation-mode", (None, "null", "prefill", "decode"),
                                         "PD runs over Mooncake TCP on CPU (tests/e2e/test_spec_pd_slow.py)"),
    "speculative_algorithm": AllowedValues("--speculative-algorithm", (None, "K3_CSV"),
                                           "SGLang's own speculative workers (EAGLE, DSpark, NGRAM) have no CPU path; "
                                           "K3_CSV runs on SGLang's verify contract there (docs/spec.md)"),
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


MUST_BE_ON: dict[str, tuple[str, str]] = {
    "disable_overlap_schedule": ("--disable-overlap-schedule",
                                 "the overlap scheduler: SGLang's K3 on CPU runs with --disable-overlap-schedule (k3 "
                                 "serve's default; the no_buffer KDA prefix cache needs it)"),
}
EAGER = "SGLang's K3 runs eagerly on CPU"


def _dcp_prefix_cache(args) -> list[str]:
    if (int(getattr(args, "dcp_size", 1) or 1) > 1 and _strategy(args) == "no_buffer"
            and not getattr(args, "disable_radix_cache", False)):
        return ["--mamba-radix-cache-strategy no_buffer under --dcp-size > 1: DCP's radix pages hold "
                "page_size x dcp tokens and need the extra_buffer KDA snapshots (k3 serve's default there), "
                "or --disable-radix-cache"]
    return []


def _strategy(args):
    value = getattr(args, "mamba_radix_cache_strategy", None)
    return getattr(value, "value", value)


def _k3_csv(args) -> list[str]:
    algorithm = getattr(args, "speculative_algorithm", None)
    if str(getattr(algorithm, "value", algorithm)) != "K3_CSV":
        return []
    return spec_refusals(args)


def spec_refusals(args) -> list[str]:
    """K3_CSV (k3_sglang/spec) settings this server cannot run: a model or backend outside SGLang's verify contract
    (spec/contract.py), PP under PD, the extra_buffer prefix cache, fewer than 2 draft tokens, bad K3_SPEC_*.
    (`k3 serve` sets SGLANG_ENABLE_PP_SPEC for K3_CSV under PP; spec/pp_hooks.py checks the rest.)"""
    from k3_sglang.worker_settings import WorkerSettings
    from k3_sglang.spec.contract import contract_refusals

    reasons = contract_refusals(args)
    pp = int(getattr(args, "pp_size", 1) or 1)
    mode = getattr(args, "disaggregation_mode", "null") or "null"
    if pp > 1 and mode != "null":
        reasons.append(f"--speculative-algorithm K3_CSV with --pp-size {pp} and --disaggregation-mode {mode}: "
                       "SGLang's pipeline speculation relay is aggregated-only (run the PP prefill server without "
                       "speculation, K3_CSV on the decode server)")
    try:
        WorkerSettings.from_env().spec.ready()
    except ValueError as e:
        return reasons + [str(e)]
    if _strategy(args) == "extra_buffer" and not getattr(args, "disable_radix_cache", False):
        reasons.append("--speculative-algorithm K3_CSV with --mamba-radix-cache-strategy extra_buffer: the track-slot "
                       "copy of SGLang's commit after verification has no test here yet (a stale snapshot would "
                       "restore a wrong state on a prefix hit); use no_buffer (under DCP: --disable-radix-cache, "
                       "`k3 serve`'s default there)")
    width = getattr(args, "speculative_num_draft_tokens", None)
    if width is not None and int(width) < 2:
        reasons.append(f"--speculative-num-draft-tokens {width}: K3_CSV needs at least 2 (the root and a draft)")
    return reasons


def _checkpoint(args):
    """The K3Config of args' --model-path, or None (no path, or unreadable: --model-path validation reports that)."""
    from k3_sglang.config import K3Config

    path = getattr(args, "model_path", None)
    try:
        return K3Config.from_json(path) if path else None
    except (OSError, ValueError):
        return None


def _quantization(args) -> list[str]:
    """A checkpoint quantization the CPU path does not load (its config.json, when readable)."""
    cfg = _checkpoint(args)
    problem = cfg.quant.cpu_problem() if cfg is not None else None
    return [problem] if problem else []


def _mxfp4_expert_split(args) -> list[str]:
    """MXFP4 routed experts whose per-rank intermediate slice (moe_intermediate / (TP / EP)) splits a scale group:
    each rank's w2 then reads scales of another rank's columns, and the answers are wrong (TP4 without EP on
    k3-tiny: 64 / 4 = 16 < 32, caught end to end against TP1, 2026-12-07)."""
    tp, ep = int(getattr(args, "tp_size", 1) or 1), int(getattr(args, "ep_size", 1) or 1)
    cfg = _checkpoint(args) if tp > 1 else None
    if cfg is None or not cfg.quant.experts_mxfp4:
        return []
    width, group = cfg.moe.moe_intermediate_size, cfg.quant.group_size

    def whole_groups(moe_tp: int) -> bool:
        return width % moe_tp == 0 and (width // moe_tp) % group == 0

    moe_tp = max(1, tp // ep)
    if whole_groups(moe_tp):
        return []
    fix = next((e for e in range(1, tp + 1) if tp % e == 0 and whole_groups(tp // e)), tp)
    return [f"--tp-size {tp} with --ep-size {ep}: each rank's slice of the MXFP4 routed experts' intermediate "
            f"({width} / {moe_tp} = {width / moe_tp:g}) is not a multiple of the {group}-element scale group; use "
            f"--ep-size {fix} (experts whole per rank) or a smaller --tp-size"]


RULES = (
    Rule("a checkpoint quantization other than none or MXFP4 routed experts (the CPU MoE runner upcasts MXFP4 only)",
         _quantization),
    Rule("MXFP4 routed experts split by `--tp-size` / `--ep-size` below their 32-element scale group (each rank's "
         "slice of the expert intermediate must be a multiple of it; raise `--ep-size`)", _mxfp4_expert_split),
    Rule("`--mamba-radix-cache-strategy no_buffer` with the radix cache on under `--dcp-size` > 1 (DCP's radix pages "
         "need extra_buffer's snapshots, `k3 serve`'s default there; or `--disable-radix-cache`)", _dcp_prefix_cache),
    Rule("K3_CSV where [spec.md](spec.md) says it cannot run (the verify contract, PP with PD, "
         "extra_buffer with the radix cache, fewer than 2 draft tokens, bad `K3_SPEC_*`)", _k3_csv),
)


def limits() -> PlatformLimits:
    """SGLang's K3 on the k3_cpu platform, read from this module's tables at call time."""
    return PlatformLimits("sglang-k3-cpu", "SGLang's K3 on the k3_cpu platform", SUPPORTED_PARALLEL_SIZES,
                          "with SGLang's K3 on CPU", ALLOWED_VALUES, MUST_BE_OFF, MUST_BE_ON, EAGER, RULES)


def refusals(args) -> list[str]:
    """Every reason SGLang's K3 cannot serve `args` (SGLang argument names) on the k3_cpu platform."""
    return table_refusals(limits(), args)


def refusal_message(reasons: list[str]) -> str:
    lines = "\n".join(f"  - {r}" for r in reasons)
    return (f"SGLang's K3 cannot serve this configuration on the k3_cpu platform:\n{lines}\n"
            "A CUDA host serves the rest of SGLang's features.")
