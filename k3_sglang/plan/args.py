"""Command-line flags that describe a plan; shared by `k3 plan` and `k3 launch render`.

A plan comes from a file (positional PLAN), a named preset (--preset) or flags alone (--system ...).
Flags override what the file or preset says. --tp/--dcp/... edit the single group of a plan (or make
one); --prefill/--decode 'tp=1,pp=8,replicas=2' replace the groups with a PD topology.
"""

from __future__ import annotations

import argparse
from typing import Any

from k3_sglang.plan.fields import require_mapping
from k3_sglang.plan.presets import PLAN_PRESETS, plan_preset
from k3_sglang.plan.spec import PlanSpec, read_plan_document, spec_from_dict
from k3_sglang.plan.system import SYSTEM_PRESETS

# flag dest -> (plan section, field)
SECTION_FLAGS = {
    "model": (None, "model"),
    "kv_cache": ("precision", "kv_cache"), "kda_state": ("precision", "kda_state"),
    "experts": ("precision", "experts"),
    "context_length": ("workload", "context_length"), "output_length": ("workload", "output_length"),
    "sessions": ("workload", "sessions"),
    "mem_fraction_static": ("serving", "mem_fraction_static"),
    "mamba_ratio": ("serving", "mamba_full_memory_ratio"),
    "mamba_strategy": ("serving", "mamba_radix_cache_strategy"), "page_size": ("serving", "page_size"),
    "draft_tokens": ("serving", "draft_tokens"), "max_running_requests": ("serving", "max_running_requests"),
    "decode_radix_cache": ("serving", "decode_radix_cache"),
    "attention_backend": ("serving", "attention_backend"),
    "states_per_path": ("serving", "mamba_states_per_path"), "hicache_host_gib": ("serving", "hicache_host_gib"),
}
GROUP_FLAGS = ("tp", "dcp", "pp", "ep", "dp_attention", "replicas", "pp_layer_partition", "chunked_prefill_size")
GROUP_INT_FIELDS = ("tp", "dcp", "pp", "ep", "dp_attention", "replicas", "chunked_prefill_size")


def _ratio(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _partition(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer counts, got {text!r}") from None


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the plan-describing flags on `parser`."""
    parser.add_argument("plan", nargs="?", metavar="PLAN.yaml", help="a saved plan (YAML, or `k3 plan --json` output)")
    parser.add_argument("--preset", help=f"a named plan: {', '.join(PLAN_PRESETS)}")
    parser.add_argument("--system", help=f"system preset ({', '.join(SYSTEM_PRESETS)}) or a system YAML file")
    parser.add_argument("--model", help="K3 preset (k3-full, k3-tiny) or a config.json path")
    precision = parser.add_argument_group("precision")
    precision.add_argument("--kv-cache", help="MLA KV cache dtype: bf16 | fp8_e4m3")
    precision.add_argument("--kda-state", help="KDA recurrent state dtype: fp32 | bf16")
    precision.add_argument("--experts", help="routed experts: mxfp4 | bf16 (dequantised)")
    topo = parser.add_argument_group("topology (one group)")
    for name in GROUP_INT_FIELDS:
        topo.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name)
    topo.add_argument("--pp-layer-partition", type=_partition, help="layers per PP stage, e.g. 11,11,11,12,12,12,12,12")
    topo.add_argument("--prefill", action="append", metavar="K=V,...", help="a prefill group, e.g. tp=1,pp=8,replicas=2")
    topo.add_argument("--decode", action="append", metavar="K=V,...", help="a decode group, e.g. tp=8,dcp=8,ep=8")
    work = parser.add_argument_group("workload and SGLang knobs")
    work.add_argument("--context-length", type=int)
    work.add_argument("--output-length", type=int)
    work.add_argument("--sessions", type=int)
    work.add_argument("--mem-fraction-static", type=float)
    work.add_argument("--mamba-ratio", type=_ratio, help="state/KV pool ratio, or 'auto' for the balanced r*")
    work.add_argument("--mamba-strategy", help="extra_buffer | extra_buffer_lazy | no_buffer")
    work.add_argument("--page-size", type=int)
    work.add_argument("--draft-tokens", type=int)
    work.add_argument("--max-running-requests", type=int)
    work.add_argument("--attention-backend", help="MLA attention backend: auto (k3_dcp_mla for DCP off Blackwell) | "
                                                  "k3_dcp_mla | sglang | cutedsl_mla (docs/capacity.md)")
    work.add_argument("--decode-radix-cache", action="store_const", const=True, default=None,
                      help="PD decode servers keep a radix cache (--disaggregation-decode-enable-radix-cache): "
                           "S state slots per request as unified, instead of 1")
    work.add_argument("--states-per-path", type=int, help="KDA states a cached session keeps "
                      "(--mamba-max-states-per-path; -1: SGLang's no cap, one per prefill chunk)")
    work.add_argument("--hicache-host-gib", type=float, help="HiCache host tier per rank in GiB: cached sessions on "
                      "host, split between latent rows and KDA states by the workload")


def parse_group_flag(role: str, text: str) -> dict[str, Any]:
    """'tp=1,pp=8,replicas=2' -> {'role': role, 'tp': 1, 'pp': 8, 'replicas': 2}."""
    group: dict[str, Any] = {"role": role}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in GROUP_FLAGS:
            raise ValueError(f"--{role}: bad item {item!r}; expected K=V with K in {', '.join(GROUP_FLAGS)}")
        try:
            group[key] = [int(v) for v in value.split(":")] if key == "pp_layer_partition" else int(value)
        except ValueError:
            raise ValueError(f"--{role}: {key}: expected an integer, got {value!r}") from None
    return group


def _base_document(args: argparse.Namespace) -> dict[str, Any]:
    if args.plan and args.preset:
        raise ValueError("plan: give a plan file or --preset, not both")
    if args.plan:
        return dict(read_plan_document(args.plan))
    if args.preset:
        return plan_preset(args.preset)
    return {}


def _apply_group_flags(doc: dict[str, Any], args: argparse.Namespace) -> None:
    if args.prefill or args.decode:
        doc["groups"] = ([parse_group_flag("prefill", t) for t in args.prefill or []]
                         + [parse_group_flag("decode", t) for t in args.decode or []])
    edits = {k: getattr(args, k) for k in GROUP_FLAGS if getattr(args, k) is not None}
    if not edits:
        doc.setdefault("groups", [{"role": "unified"}])
        return
    groups = doc.get("groups") or [{"role": "unified"}]
    if not isinstance(groups, list) or len(groups) != 1:
        raise ValueError("groups: --tp/--dcp/... edit a one-group plan; use --prefill/--decode for PD plans")
    doc["groups"] = [{**require_mapping("groups[0]", groups[0]), **edits}]


def plan_document_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The plan mapping after applying flags over the file or preset (raw; not yet validated)."""
    doc = _base_document(args)
    if args.system is not None:
        doc["system"] = args.system
    if "system" not in doc:
        raise ValueError("system: missing; give --system PRESET, --preset NAME or a plan file")
    for dest, (section, key) in SECTION_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if section is None:
            doc[key] = value
        else:
            doc[section] = {**require_mapping(section, doc.get(section, {})), key: value}
    _apply_group_flags(doc, args)
    return doc


def spec_from_args(args: argparse.Namespace) -> PlanSpec:
    """The validated PlanSpec the flags describe (ValueError names the bad field)."""
    doc = plan_document_from_args(args)
    doc.pop("launch", None)
    return spec_from_dict(doc)
