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

The checks read SGLang's own argument names, so they apply to SGLang's parsed command line (`parse_sglang_argv`,
what `k3 serve` checks) and to a ServerArgs (what serving/launch.py re-checks in the server process).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLimit:
    """One SGLang parallel size: its flag, the largest size the portable model serves, what it is and why."""

    flag: str
    supported: int
    what: str
    why: str


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
GRAPH_PHASES = ("decode", "prefill")


def graph_backend(args, phase: str) -> str | None:
    """The CUDA graph backend SGLang would pick for phase from these arguments, by its own precedence
    (legacy --disable-cuda-graph < --disable-<phase>-cuda-graph < --cuda-graph-backend-<phase> < --cuda-graph-config);
    None means SGLang's default (graphs on, on CUDA)."""
    backend = None
    if getattr(args, "disable_cuda_graph", False) or getattr(args, f"disable_{phase}_cuda_graph", False):
        backend = "disabled"
    explicit = getattr(args, f"cuda_graph_backend_{phase}", None)
    if explicit is not None:
        backend = str(explicit)
    config = getattr(args, "cuda_graph_config", None)
    phase_config = config.get(phase) if isinstance(config, dict) else getattr(config, phase, None)
    phase_backend = phase_config.get("backend") if isinstance(phase_config, dict) else getattr(phase_config, "backend", None)
    return backend if phase_backend is None else str(phase_backend)


def portable_refusals(args) -> list[str]:
    """Every reason the portable model cannot serve `args` (SGLang argument names); empty when it can."""
    reasons = []
    for field, limit in SUPPORTED_PARALLEL_SIZES.items():
        size = getattr(args, field, 1)
        if size is not None and int(size) > limit.supported:
            reasons.append(f"{limit.flag} {size}: {limit.what} is not built into the portable model yet "
                           f"(supported: {limit.supported}; {limit.why})")
    dcp, pp = int(getattr(args, "dcp_size", 1) or 1), int(getattr(args, "pp_size", 1) or 1)
    if dcp > 1 and pp > 1:  # TP x PP is served (tests/e2e/test_pp_slow.py); DCP inside a pipeline stage is untested
        reasons.append(f"--dcp-size {dcp} with --pp-size {pp}: decode context parallelism inside a pipeline stage "
                       "is not tested with the portable model yet")
    if getattr(args, "enable_dp_attention", False):
        reasons.append("--enable-dp-attention: DP attention is not built into the portable model yet")
        if int(getattr(args, "dcp_size", 1) or 1) > 1:
            reasons.append("--dcp-size with --enable-dp-attention: DCP stripes the KV cache over the attention-TP "
                           "group, which DP attention splits up")
    strategy = getattr(args, "mamba_radix_cache_strategy", "no_buffer")
    if dcp > 1 and not getattr(args, "disable_radix_cache", False) and strategy == "no_buffer":
        reasons.append(f"--dcp-size {dcp} with the radix cache and --mamba-radix-cache-strategy no_buffer: SGLang's "
                       "DCP pages hold page_size x dcp_size tokens and its KDA prefix cache then needs state "
                       "snapshots at page boundaries; use extra_buffer (`k3 serve`'s default under DCP) or "
                       "--disable-radix-cache")
    reasons += layout_refusals(args)
    algorithm = getattr(args, "speculative_algorithm", None)
    if algorithm and str(algorithm).upper() not in SUPPORTED_SPECULATIVE_ALGORITHMS:
        supported = ", ".join(sorted(SUPPORTED_SPECULATIVE_ALGORITHMS)) or "none yet"
        reasons.append(f"--speculative-algorithm {algorithm}: not supported by the portable model (supported: "
                       f"{supported}); its KDA layers keep no per-draft states for SGLang's verify to commit")
    elif algorithm:
        reasons += spec_refusals(args)
    if strategy not in SUPPORTED_MAMBA_STRATEGIES:
        reasons.append(f"--mamba-radix-cache-strategy {strategy}: the portable model serves "
                       f"{' and '.join(SUPPORTED_MAMBA_STRATEGIES)} (its KDA layer writes extra_buffer's snapshots "
                       "itself; the lazy variant is not exercised)")
    for phase in GRAPH_PHASES:
        backend = graph_backend(args, phase)
        if backend != "disabled":
            shown = backend or "SGLang's default: on"
            reasons.append(f"CUDA graphs for {phase} ({shown}): the portable model runs eagerly only "
                           f"(--cuda-graph-backend-{phase} disabled, k3 serve's default for it)")
    return reasons


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


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit; we want one clear CLI error
        raise ValueError(f"SGLang does not accept this command line: {message}")


def parse_sglang_argv(argv: list[str]) -> argparse.Namespace:
    """SGLang's own parse of a server command line (its parser, `--config` YAML merged as SGLang does), without
    ServerArgs resolution. Raises ValueError for a command line SGLang would reject."""
    from sglang.srt.server_args import ServerArgs

    from k3_sglang.dcp_mla import add_backend_choice as add_dcp_backend_choice
    from k3_sglang.sglang_cpu import add_backend_choice

    add_backend_choice()  # the k3_cpu_mla and k3_dcp_mla backends our plugins register in SGLang's processes
    add_dcp_backend_choice()
    parser = _RaisingParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    return parser.parse_args(argv)
