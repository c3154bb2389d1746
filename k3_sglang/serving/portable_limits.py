"""What the portable K3 model (k3_sglang.models) cannot serve correctly, refused before any server starts.

The portable layers read and write SGLang's pools directly instead of going through SGLang's linear-attention
backend, shard their weights only in the layouts built here (TP/EP, DCP stripes, PP stages: k3_sglang/parallel) and
keep per-draft KDA records only for our own K3_CSV verify, so these configurations would give wrong answers (or fail
deep inside a rank) and are refused with one message listing every reason:

- parallel sizes above the table below (one entry per size: lifting a limit is one edit once the model has it),
  DP attention, and DCP inside a pipeline stage;
- speculative algorithms outside the supported set (K3_CSV, ours: k3_sglang/spec), and K3_CSV with PD
  disaggregation inside a pipeline (K3_CSV inside an aggregated pipeline is served: spec/pp_hooks.py), with SGLang's
  torch_native MLA extend or with the extra_buffer prefix cache (verify writes no track snapshots);
- mamba radix-cache strategies other than `no_buffer` and `extra_buffer` (the portable KDA layer writes
  extra_buffer's track-slot snapshots itself, model/kda_snapshot.py; `extra_buffer_lazy` is not exercised), and
  `no_buffer` with the radix cache under DCP (SGLang's DCP tree pages hold page_size x dcp_size tokens, and
  no_buffer serves page size 1 only);
- CUDA graphs in either phase (decode gathers sized on the host, Python loops over requests).

The checks read SGLang's own argument names, so they apply to SGLang's parsed command line (the `Deployment`'s,
k3_sglang/deployment.py: what `k3 serve` checks) and to a ServerArgs (what serving/launch.py re-checks in the server
process). The limits are one table (`limits()`, read by serving/limits_table.py's engine); docs/serving.md's list
of them is generated from it (`python -m k3_sglang.serving.limits_table --write`).
"""

from __future__ import annotations

from k3_sglang.deployment import parse_sglang_argv  # noqa: F401 - re-exported (tests, bench scripts)
from k3_sglang.serving.limits_table import AllowedValues, ParallelLimit, PlatformLimits, Rule, table_refusals

# SGLang field -> limit (PP: k3_sglang/parallel/pipeline.py). Raise `supported` here when the model gets a size.
SUPPORTED_PARALLEL_SIZES: dict[str, ParallelLimit] = {
    "tp_size": ParallelLimit("--tp-size", 8, "tensor parallelism", "tested up to 8 ranks (k3_sglang/parallel/tp.py)"),
    "pp_size": ParallelLimit("--pp-size", 4, "pipeline parallelism", "tested up to 4 stages (k3_sglang/parallel)"),
    "dcp_size": ParallelLimit("--dcp-size", 8, "decode context parallelism", "tested up to 8 ranks (k3_sglang/dcp_mla)"),
    "attn_dp_size": ParallelLimit("--attn-dp-size", 1, "DP attention", "no attention-DP gather/scatter"),
    "attn_cp_size": ParallelLimit("--attn-cp-size", 1, "attention context parallelism", "no CP split of prefill"),
    "ep_size": ParallelLimit("--ep-size", 8, "expert parallelism", "tested up to 8 ranks (k3_sglang/parallel/tp.py)"),
    "moe_dp_size": ParallelLimit("--moe-dp-size", 1, "MoE data parallelism", "no MoE all-to-all"),
    "dp_size": ParallelLimit("--dp-size", 1, "data-parallel replicas", "not exercised with this model yet"),
}
SUPPORTED_SPECULATIVE_ALGORITHMS: frozenset[str] = frozenset({"K3_CSV"})
SUPPORTED_MAMBA_STRATEGIES = ("no_buffer", "extra_buffer")
MUST_BE_OFF: dict[str, tuple[str, str]] = {
    "enable_dp_attention": ("--enable-dp-attention", "DP attention is not built into the portable model yet"),
}
EAGER = "the portable model runs eagerly only"


def _allowed() -> dict[str, AllowedValues]:
    return {
        "speculative_algorithm": AllowedValues(
            "--speculative-algorithm", (None, *sorted(SUPPORTED_SPECULATIVE_ALGORITHMS)),
            "not supported by the portable model; its KDA layers keep no per-draft states for SGLang's verify to "
            "commit", upper=True),
        "mamba_radix_cache_strategy": AllowedValues(
            "--mamba-radix-cache-strategy", SUPPORTED_MAMBA_STRATEGIES,
            f"the portable model serves {' and '.join(SUPPORTED_MAMBA_STRATEGIES)} (its KDA layer writes "
            "extra_buffer's snapshots itself; the lazy variant is not exercised)"),
    }


def _sizes(args) -> tuple[int, int]:
    return int(getattr(args, "dcp_size", 1) or 1), int(getattr(args, "pp_size", 1) or 1)


def _dcp_in_pipeline(args) -> list[str]:
    dcp, pp = _sizes(args)
    if dcp > 1 and pp > 1:  # TP x PP is served (tests/e2e/test_pp_slow.py); DCP inside a pipeline stage is untested
        return [f"--dcp-size {dcp} with --pp-size {pp}: decode context parallelism inside a pipeline stage "
                "is not tested with the portable model yet"]
    return []


def _dcp_with_dp_attention(args) -> list[str]:
    if getattr(args, "enable_dp_attention", False) and _sizes(args)[0] > 1:
        return ["--dcp-size with --enable-dp-attention: DCP stripes the KV cache over the attention-TP "
                "group, which DP attention splits up"]
    return []


def _dcp_prefix_cache(args) -> list[str]:
    dcp = _sizes(args)[0]
    strategy = getattr(args, "mamba_radix_cache_strategy", "no_buffer")
    if dcp > 1 and not getattr(args, "disable_radix_cache", False) and strategy == "no_buffer":
        return [f"--dcp-size {dcp} with the radix cache and --mamba-radix-cache-strategy no_buffer: SGLang's "
                "DCP pages hold page_size x dcp_size tokens and its KDA prefix cache then needs state "
                "snapshots at page boundaries; use extra_buffer (`k3 serve`'s default under DCP) or "
                "--disable-radix-cache"]
    return []


def _k3_csv(args) -> list[str]:
    algorithm = getattr(args, "speculative_algorithm", None)
    return spec_refusals(args) if algorithm and str(algorithm).upper() in SUPPORTED_SPECULATIVE_ALGORITHMS else []


RULES = (
    Rule("`--dcp-size` > 1 with `--pp-size` > 1 (DCP inside a pipeline stage is untested)", _dcp_in_pipeline),
    Rule("`--dcp-size` > 1 with `--enable-dp-attention` (DCP stripes the KV cache over the attention-TP group)",
         _dcp_with_dp_attention),
    Rule("`--mamba-radix-cache-strategy no_buffer` with the radix cache on under `--dcp-size` > 1 (use "
         "extra_buffer, `k3 serve`'s default under DCP, or `--disable-radix-cache`)", _dcp_prefix_cache),
    Rule("TP/EP/DCP sizes that do not fit the checkpoint's head counts and widths, `--ep-size` not dividing "
         "`--tp-size`, and a quantization other than MXFP4 routed experts", lambda args: layout_refusals(args)),
    Rule("K3_CSV where [spec.md](spec.md) says it cannot run (PP with PD, the torch_native MLA extend, "
         "extra_buffer with the radix cache, fewer than 2 draft tokens, bad `K3_SPEC_*`)", _k3_csv),
)


def limits() -> PlatformLimits:
    """The portable model (any device), read from this module's tables at call time."""
    return PlatformLimits("portable", "The portable model (any device)", SUPPORTED_PARALLEL_SIZES,
                          "is not built into the portable model yet", _allowed(), MUST_BE_OFF, {}, EAGER, RULES)


def portable_refusals(args) -> list[str]:
    """Every reason the portable model cannot serve `args` (SGLang argument names); empty when it can."""
    return table_refusals(limits(), args)


def spec_refusals(args, portable: bool = True) -> list[str]:
    """K3_CSV (k3_sglang/spec) settings this server cannot run: a model or backend outside SGLang's verify contract
    (spec/contract.py), PP under PD, the torch_native MLA baseline, bad K3_SPEC_*. (`k3 serve` sets
    SGLANG_ENABLE_PP_SPEC for K3_CSV under PP; spec/pp_hooks.py checks the rest.) portable: the portable model
    serves (else SGLang's K3)."""
    from k3_sglang.model.settings import WorkerSettings
    from k3_sglang.spec.contract import contract_refusals

    reasons = contract_refusals(args, portable)
    pp = int(getattr(args, "pp_size", 1) or 1)
    mode = getattr(args, "disaggregation_mode", "null") or "null"
    if pp > 1 and mode != "null":
        reasons.append(f"--speculative-algorithm K3_CSV with --pp-size {pp} and --disaggregation-mode {mode}: "
                       "SGLang's pipeline speculation relay is aggregated-only (run the PP prefill server without "
                       "speculation, K3_CSV on the decode server)")
    try:
        settings = WorkerSettings.from_env()
        settings.spec.ready()
    except ValueError as e:
        return reasons + [str(e)]
    if settings.mla_extend == "torch_native":
        reasons.append("--speculative-algorithm K3_CSV with K3_MLA_EXTEND=torch_native: verify runs on the chunked "
                       "MLA extend path only")
    if (getattr(args, "mamba_radix_cache_strategy", "no_buffer") == "extra_buffer"
            and not getattr(args, "disable_radix_cache", False)):
        reasons.append("--speculative-algorithm K3_CSV with --mamba-radix-cache-strategy extra_buffer: the track-slot "
                       "copy of SGLang's commit after verification has no test here yet (a stale snapshot would "
                       "restore a wrong state on a prefix hit); use no_buffer (under DCP: --disable-radix-cache, "
                       "`k3 serve`'s default there)")
    width = getattr(args, "speculative_num_draft_tokens", None)
    if width is not None and int(width) < 2:
        reasons.append(f"--speculative-num-draft-tokens {width}: K3_CSV needs at least 2 (the root and a draft)")
    return reasons


def layout_refusals(args) -> list[str]:
    """TP/EP/DCP sizes that do not fit the checkpoint's head counts and widths, and a quantization the portable
    model does not load (its config.json, when readable)."""
    from k3_sglang.config import K3Config
    from k3_sglang.parallel.tp import tp_constraint_errors

    path = getattr(args, "model_path", None)
    try:
        cfg = K3Config.from_json(path) if path else None
    except (OSError, ValueError):
        return []  # an unreadable config is reported by --model-path validation
    if cfg is None:
        return []
    reasons = [cfg.quant.portable_problem()] if cfg.quant.portable_problem() else []
    tp, ep, dcp = (int(getattr(args, name, 1) or 1) for name in ("tp_size", "ep_size", "dcp_size"))
    if ep > tp or tp % ep:
        return reasons + [f"--ep-size {ep} must divide --tp-size {tp}"]
    return reasons + tp_constraint_errors(cfg, attn_tp=tp, moe_tp=tp // ep, moe_ep=ep, dcp=dcp)



def refusal_message(reasons: list[str]) -> str:
    lines = "\n".join(f"  - {r}" for r in reasons)
    return (f"the portable K3 model (k3_sglang.models) cannot serve this configuration correctly:\n{lines}\n"
            "SGLang's own K3 serves these on CUDA: use a full K3 checkpoint and leave K3_MODEL_IMPL unset "
            "(or set K3_MODEL_IMPL=sglang).")
