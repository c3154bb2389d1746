"""The command lines: `k3 serve` per host of each instance, and `k3 router` in front of them.

Arguments are plain strings, except `Raw` ones: shell text already quoted (a "$VAR" reference)
that the shell renderers paste verbatim. Every SGLang flag used here exists in SGLang 0.5.23's
ServerArgs (tests/launch checks the rendered scripts against it).
"""

from __future__ import annotations

import shlex

from k3_sglang.launch.layout import Instance
from k3_sglang.launch.settings import LaunchSettings
from k3_sglang.plan.attention import backend_args
from k3_sglang.plan.spec import PlanSpec

SERVE = ("k3", "serve")
ROUTER = ("k3", "router")
LISTEN_HOST = "0.0.0.0"


class Raw(str):
    """Shell text pasted as-is (already quoted), e.g. '"$MODEL_PATH"'."""


def shell_words(words: list[str]) -> str:
    """Join words for a shell script; plain words are quoted, Raw ones kept."""
    return " ".join(w if isinstance(w, Raw) else shlex.quote(w) for w in words)


def _parallel_args(instance: Instance, spec: PlanSpec) -> list[str]:
    g = instance.group
    args = ["--tp-size", str(g.tp)]
    if g.dcp > 1:
        backend = "fi_a2a" if spec.system.network == "mnnvl" else "a2a"
        args += ["--dcp-size", str(g.dcp), "--dcp-comm-backend", backend]
    if g.pp > 1:
        args += ["--pp-size", str(g.pp)]
    if g.ep > 1:
        args += ["--ep-size", str(g.ep)]
    if g.dp_attention > 1:
        args += ["--enable-dp-attention", "--dp-size", str(g.dp_attention)]
    return args


def _memory_args(instance: Instance, spec: PlanSpec) -> list[str]:
    plan, serving, precision = instance.plan, spec.serving, spec.precision
    args = ["--kv-cache-dtype", precision.kv_cache_flag, "--mamba-ssm-dtype", precision.ssm_dtype_flag,
            "--mamba-full-memory-ratio", f"{plan.bound.memory.mamba_ratio:g}",
            "--mamba-radix-cache-strategy", serving.mamba_radix_cache_strategy,
            "--mamba-max-states-per-path", str(serving.mamba_states_per_path),
            "--mem-fraction-static", f"{serving.mem_fraction_static:g}", "--page-size", str(serving.page_size)]
    if serving.max_running_requests is not None:
        args += ["--max-running-requests", str(serving.max_running_requests)]
    if instance.group.chunked_prefill_size is not None:
        size = str(instance.group.chunked_prefill_size)
        args += ["--chunked-prefill-size", size, "--max-prefill-tokens", size]
    if precision.experts_mxfp4:
        args += ["--moe-runner-backend", "flashinfer_mxfp4" if spec.system.native_mxfp4 else "marlin"]
    return args


def _pd_args(instance: Instance, spec: PlanSpec) -> list[str]:
    if instance.group.role == "unified":
        return []
    args = ["--disaggregation-mode", instance.group.role, "--disaggregation-transfer-backend", "mooncake",
            "--disaggregation-bootstrap-port", str(instance.bootstrap_port)]
    if instance.group.role == "decode" and spec.serving.decode_radix_cache:
        args.append("--disaggregation-decode-enable-radix-cache")  # the plan counts S slots, not 1
    if spec.system.ib_devices and spec.system.network != "mnnvl":
        args += ["--disaggregation-ib-device", ",".join(spec.system.ib_devices)]
    return args


def serve_command(instance: Instance, spec: PlanSpec, model_path: str, node_rank: str, dist_init_addr: str,
                  with_gpu_offset: bool = True) -> list[str]:
    """`k3 serve` for one host of an instance; node_rank/dist_init_addr may be Raw shell or $(K8S_VAR) text."""
    words = list(SERVE) + ["--model-path", model_path, "--trust-remote-code"]
    words += _parallel_args(instance, spec) + backend_args(instance.plan.attention_backend)
    words += _memory_args(instance, spec) + _pd_args(instance, spec)
    if instance.nnodes > 1:
        words += ["--nnodes", str(instance.nnodes), "--node-rank", node_rank, "--dist-init-addr", dist_init_addr]
    if with_gpu_offset and instance.base_gpu_id:
        words += ["--base-gpu-id", str(instance.base_gpu_id)]
    words += ["--host", LISTEN_HOST, "--port", str(instance.port)]
    partition = instance.group.pp_layer_partition
    if partition is not None:
        words = ["env", f"SGLANG_PP_LAYER_PARTITION={','.join(map(str, partition))}"] + words
    return words


def router_command(workers: list[tuple[str, Instance]], settings: LaunchSettings) -> list[str]:
    """`k3 router` over every server (prefill first): `--worker URL` for a unified server, and under PD
    `--prefill URL BOOTSTRAP_PORT` / `--decode URL`, so the router pairs them (docs/pd.md)."""
    words = list(ROUTER)
    for url, instance in workers:
        role = instance.group.role
        if role == "prefill":
            words += ["--prefill", url, str(instance.bootstrap_port)]
        elif role == "decode":
            words += ["--decode", url]
        else:
            words += ["--worker", url]
    return words + ["--host", LISTEN_HOST, "--port", str(settings.router_port)]


def serving_env(spec: PlanSpec) -> dict[str, str]:
    """Environment every server gets: Mooncake over MNNVL on racks (PD), nothing else by default."""
    env: dict[str, str] = {}
    if spec.topology.disaggregated and spec.system.network == "mnnvl":
        env["SGLANG_MOONCAKE_CUSTOM_MEM_POOL"] = "True"
        env["MC_FORCE_MNNVL"] = "True"
    return env


def nic_pinning_env(spec: PlanSpec) -> dict[str, str]:
    """NCCL/Gloo bootstrap NIC (and IB HCAs) for hosts joined by InfiniBand/RoCE."""
    system = spec.system
    env: dict[str, str] = {}
    if system.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = system.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = system.socket_ifname
    if system.ib_devices:
        env["NCCL_IB_HCA"] = ",".join(system.ib_devices)
    return env
