"""`k3 serve [--model-path DIR] [any sglang args]`: SGLang's server with K3 registered.

With no --model-path it builds the k3-tiny checkpoint once into the cache folder and serves
it on 127.0.0.1:30000. One model serves everywhere: SGLang's own K3 (`sglang.srt.models.kimi_k3`)
with the checkpoint's quantization; on a host without CUDA it runs on our k3_cpu platform with the CPU
kernels our plugin plugs into its seams (k3_sglang/sglang_cpu), and what it cannot serve there is
refused before anything starts (serving/sglang_cpu_limits.py). The user's SGLang flags are parsed once into a `Deployment` (k3_sglang/deployment.py, a `--config` YAML
included), which decides our defaults, the limits, the environment and, through K3_DEPLOYMENT, our
plugins; the flags themselves are passed to SGLang unchanged, our defaults only for fields the user
left unset.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from k3_sglang.deployment import Deployment
from k3_sglang.serving.kv_events_config import KvEventsSettings, hooks_env, kv_events_flags
from k3_sglang.hicache.host_sizing import mem_available_bytes
from k3_sglang.hicache.serve_flags import cpu_hicache_env, cpu_hicache_flags, cpu_host_tier
from k3_sglang.plan.sessions import CPU_MIN_SESSION_TOKENS, MAMBA_TRACK_INTERVAL, UNCAPPED, device_state_slots
from k3_sglang.serving.pd_cpu import missing_transfer_engine, pd_cpu_env, pd_cpu_flags
from k3_sglang.serving.retention import RetentionSettings
from k3_sglang.serving.settings import ServeSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
TINY_DIR_NAME = "k3-tiny-v3"  # v2: 128K-token context (max_position_embeddings 131072); v3: a miniature vision_config
# Defaults for the embedded (CPU) path; each is skipped when the user passes that flag.
CPU_DEFAULTS = {
    # The KV pool holds one 128K-token session (k3-tiny: 3 MLA layers x 80 values, 63 MB in bf16); a prompt
    # longer than the pool gets SGLang's 400 "exceeds the maximum allowed length".
    "--max-total-tokens": "131072",
    "--max-running-requests": "48",
    "--chunked-prefill-size": "512",
}
# The KDA state pool on CPU (--max-mamba-cache-size) is sized from the flags above by `cpu_state_slots`, so that
# paused sessions are bounded by the KV pool, not by state slots (k3_sglang/plan/sessions.py).
# An idle SGLang scheduler busy-polls a whole core unless told to sleep; on a 2-core host that
# starves everything else.
CPU_FLAGS = ("--sleep-on-idle",)
# SGLang's own K3 on the k3_cpu platform (k3_sglang/sglang_cpu): its absorbed MLA on our `k3_cpu_mla` backend, the
# checkpoint's own quantization config (MXFP4 experts upcast by SGLang's MXFP4 method), text only, eager, and the
# no_buffer KDA prefix cache (which needs the overlap scheduler off). serving/sglang_cpu_limits.py refuses the rest.
SGLANG_CPU_DEFAULTS = {
    "--attention-backend": "k3_cpu_mla",
    "--json-model-override-args": '{"language_model_only": true}',
    "--mamba-radix-cache-strategy": "no_buffer",
    # No --mamba-max-states-per-path cap (issue 42): SGLang's cap drops the *shallowest* states of a path, exactly
    # the chunk-boundary states a shared system prompt resumes from (three requests sharing 1,500 tokens got 0
    # cached). Every chunk's state is kept and the state pool is sized for it from the KV pool (cpu_state_slots).
    "--cuda-graph-backend-decode": "disabled",
    "--cuda-graph-backend-prefill": "disabled",
}
SGLANG_CPU_FLAGS = ("--disable-overlap-schedule",)
# SGLang's K3 on CPU under --dcp-size > 1: the k3_dcp_mla backend (k3_sglang/dcp_mla; our model-override hook would
# pick it anyway) and the extra_buffer KDA prefix cache DCP's radix pages need (under DCP SGLang's radix pages are
# page_size x dcp_size tokens, and its KDA prefix cache then needs state snapshots at page boundaries; no_buffer
# works at page size 1 only; docs/parallel.md).
SGLANG_CPU_DCP_DEFAULTS = {"--attention-backend": "k3_dcp_mla", "--mamba-radix-cache-strategy": "extra_buffer"}
# Every platform: K3's XTML reasoning and tool-call channels.
COMMON_DEFAULTS = {"--reasoning-parser": "kimi_k3", "--tool-call-parser": "kimi_k3"}
COMMON_FLAGS: tuple[str, ...] = ()
# Every platform: the `k3` radix cache (serving/radix_cache.py: KDA checkpoint events, session retention, the host
# tier's session eviction), left out where the user picked a cache of their own: another registered backend, or an
# SGLang feature that SGLang pairs with its own cache only (each refuses any --radix-cache-backend).
RADIX_CACHE_DEFAULT = {"--radix-cache-backend": "k3"}
OWN_CACHE_FIELDS = ("radix_cache_backend", "enable_lmcache", "enable_flexkv", "enable_unified_cache_external_linker",
                    "enable_kv_cache_sharding", "enable_int8_mamba_checkpoint")


def own_cache_fields(d: Deployment) -> list[str]:
    """The SGLang fields set in `d` that keep the `k3` radix cache out ([] when it serves; an explicit
    `--radix-cache-backend k3` keeps it in)."""
    args = d.args
    return [name for name in OWN_CACHE_FIELDS if args is not None and getattr(args, name, None)
            and getattr(args, name) != RADIX_CACHE_DEFAULT["--radix-cache-backend"]]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve K3 with SGLang (default: the tiny K3 on CPU, 127.0.0.1:30000)",
        description="Other flags are passed to SGLang (see `sglang serve --help`).",
    )
    parser.add_argument("--model-path", type=Path, default=None, help="K3 checkpoint folder (default: build k3-tiny)")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--dry-run", action="store_true", help="print the SGLang command line and exit")
    parser.set_defaults(func=run, accepts_extra_args=True)


def ensure_tiny_checkpoint(settings: ServeSettings) -> Path:
    """Build k3-tiny into the cache folder on first use (atomically) and return its path."""
    target = settings.cache_dir / TINY_DIR_NAME
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    from k3_sglang.tiny.checkpoint import write_tiny_checkpoint

    import fcntl
    import shutil

    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.cache_dir / (TINY_DIR_NAME + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent first runs build it once
        if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
            return target
        print(f"k3 serve: building the k3-tiny checkpoint in {target} (first run only) ...", flush=True)
        staging = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        write_tiny_checkpoint(staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def validate_model_path(path: Path) -> None:
    """Clear errors for a missing folder or an invalid K3 config (raises CliError)."""
    from k3_sglang.cli import CliError
    from k3_sglang.config import K3Config

    if not path.is_dir():
        raise CliError(f"--model-path {path}: no such folder")
    try:
        K3Config.from_json(path)
    except ValueError as exc:
        raise CliError(f"--model-path {path}: {exc}") from None


# SGLang's dynamic-chunking profiler prefills random token ids in [0, 10000) (managers/scheduler_components/
# dynamic_chunk_sizer.py); with a smaller vocabulary the embedding rejects them and SGLang quietly turns the
# feature off, so `k3 serve` refuses the flag for such a checkpoint instead.
DYNAMIC_CHUNKING_PROFILE_IDS = 10000


def check_dynamic_chunking(model_path: Path, d: Deployment) -> None:
    """Raise CliError when --enable-dynamic-chunking is asked for a checkpoint SGLang's profiler cannot run."""
    from k3_sglang.cli import CliError
    from k3_sglang.config import K3Config

    if not d.dynamic_chunking:
        return
    vocab = K3Config.from_json(model_path).vocab_size
    if vocab < DYNAMIC_CHUNKING_PROFILE_IDS:
        raise CliError(f"--enable-dynamic-chunking: SGLang profiles it with token ids up to "
                       f"{DYNAMIC_CHUNKING_PROFILE_IDS - 1}, outside this checkpoint's {vocab}-token vocabulary (it "
                       "would turn itself off); use a checkpoint with a vocabulary of at least "
                       f"{DYNAMIC_CHUNKING_PROFILE_IDS} (e.g. the bench-only k3-tiny-pp of `k3 bench pp-prefill`)")


def _deployment(extra, on_cpu: bool, model_path=None) -> Deployment:
    """The deployment a caller passed, or one parsed from raw SGLang flags (tests and callers outside `run`)."""
    if isinstance(extra, Deployment):
        return extra
    return Deployment.from_argv(list(extra), "k3_cpu" if on_cpu else "cuda", model_path)


def our_defaults(d: Deployment) -> tuple[dict[str, str], tuple[str, ...]]:
    """`k3 serve`'s defaults for this deployment: valued flags and switches (`compose` leaves out each the user set)."""
    defaults = {**COMMON_DEFAULTS, **(SGLANG_CPU_DEFAULTS if d.on_cpu else {}), **(CPU_DEFAULTS if d.on_cpu else {})}
    dcp_flags: tuple[str, ...] = ()
    if d.on_cpu and d.dcp > 1:
        defaults["--attention-backend"] = SGLANG_CPU_DCP_DEFAULTS["--attention-backend"]
        if d.speculative_algorithm is not None or d.pd:
            dcp_flags = DCP_NO_PREFIX_CACHE_FLAGS
        else:
            defaults.update(SGLANG_CPU_DCP_DEFAULTS)
    if not own_cache_fields(d):
        defaults.update(RADIX_CACHE_DEFAULT)
    if d.skip_tokenizer_init:
        defaults.pop("--reasoning-parser")
        defaults.pop("--tool-call-parser")
    flags = COMMON_FLAGS + (SGLANG_CPU_FLAGS + CPU_FLAGS if d.on_cpu else ()) + dcp_flags
    return defaults, flags


def compose(model_path: Path, host: str, port: int, d: Deployment,
            own_flags: tuple[str, ...] | list[str] = ()) -> tuple[list[str], Deployment]:
    """SGLang's command line before the user's flags (host, port, the defaults the user did not set, `own_flags`),
    and the deployment with them applied (what the server runs)."""
    argv = ["--model-path", str(model_path), "--host", host, "--port", str(port)]
    defaults, flags = our_defaults(d)
    argv += [w for flag, value in defaults.items() if not d.sets_flag(flag) for w in (flag, value)]
    argv += [f for f in flags if not d.sets_flag(f)]
    argv += list(own_flags)
    served = d.applied(argv)
    if d.on_cpu and not d.sets("max_mamba_cache_size"):
        slots = cpu_state_slots(served.args)
        if slots is not None:
            argv += ["--max-mamba-cache-size", str(slots)]
            served = d.applied(argv)
    return argv, served


def sglang_argv(model_path: Path, host: str, port: int, extra: list[str], on_cpu: bool = True,
                own_flags: tuple[str, ...] | list[str] = ()) -> list[str]:
    """SGLang's command line for the user's flags `extra` (parsed once into a Deployment on this platform): ours
    (host, port, the defaults the user did not set, `own_flags`), then the user's flags."""
    d = _deployment(list(extra), on_cpu, model_path)
    return compose(model_path, host, port, d, own_flags)[0] + list(extra)


def cpu_state_slots(args) -> int | None:
    """`--max-mamba-cache-size` for a CPU server with these SGLang arguments (a parsed namespace, or a flag list
    parsed here): S slots per running request (SGLang's ratio for the strategy, overlap off) plus P states for every
    cached session of CPU_MIN_SESSION_TOKENS in the KV pool (P = --mamba-max-states-per-path; uncapped, the default:
    one state per prefill chunk, or per --mamba-track-interval under extra_buffer, + 1). None for arguments SGLang
    or the limits will refuse anyway (they name the bad value); ValueError for a flag list SGLang's parser refuses."""
    from k3_sglang.plan.sessions import states_per_cached_session
    from k3_sglang.plan.workload import Serving

    strategy = None
    if isinstance(args, (list, tuple)):
        parsed = Deployment.from_argv(list(args))  # ValueError: SGLang refuses this command line, naming the flag
        args = parsed.args
        strategy = None if parsed.sets("mamba_radix_cache_strategy") else "no_buffer"  # k3 serve's CPU default

    def value(name: str, default: int) -> int:
        got = getattr(args, name, None)
        return default if got is None else int(got)

    running = value("max_running_requests", 48)
    if getattr(args, "disable_radix_cache", False):
        return running  # SGLang's ratio is 1 and nothing is cached
    strategy = strategy or getattr(args, "mamba_radix_cache_strategy", None) or "no_buffer"
    overlap = not getattr(args, "disable_overlap_schedule", False)
    try:
        per_request = Serving(mamba_radix_cache_strategy=strategy).state_slots_per_request(overlap)
    except ValueError:
        return None
    cap = value("mamba_max_states_per_path", UNCAPPED)
    chunk = value("chunked_prefill_size", 512)
    if strategy.startswith("extra_buffer"):  # one tracked state per interval, not per chunk
        interval = value("mamba_track_interval", MAMBA_TRACK_INTERVAL)
        chunk = min(chunk, interval) if chunk > 0 and interval > 0 else max(chunk, interval)
    kv_tokens = value("max_total_tokens", 131072)
    if cap != UNCAPPED and cap < 1 or running < 1 or kv_tokens < 1:
        return None
    per_session = states_per_cached_session(CPU_MIN_SESSION_TOKENS, chunk if chunk > 0 else kv_tokens, cap)
    return device_state_slots(kv_tokens, running, per_request, per_session, CPU_MIN_SESSION_TOKENS)


# K3_CSV's verify steps leave no extra_buffer track snapshots (SGLang's commit after verification writes the request's
# own slot; its track-slot copy is untested here), so a speculative DCP server keeps no_buffer and
# turns the radix cache off instead; so does a PD server under DCP (its decode pool then holds one KDA slot per request, the rule `k3 plan` sizes with).
DCP_NO_PREFIX_CACHE_FLAGS = ("--disable-radix-cache",)


# The retired portable model's package (it was registered through SGLANG_EXTERNAL_MODEL_PACKAGE); an inherited
# export of it is dropped (SGLang would fail to import it).
RETIRED_MODEL_PACKAGE = "k3_sglang.models"
# K3_MODEL_IMPL picked the portable model or SGLang's K3 until the portable model retired: `k3 serve` ignores it
# with a warning, and refuses K3_MODEL_IMPL=portable (exit 2) rather than silently serving another model.
RETIRED_MODEL_IMPL_ENV = "K3_MODEL_IMPL"


def retired_model_impl(environ=None) -> tuple[str | None, str | None]:
    """(error, warning) for a K3_MODEL_IMPL left in the environment: an error for `portable`, a warning otherwise."""
    value = (os.environ if environ is None else environ).get(RETIRED_MODEL_IMPL_ENV, "").strip()
    if not value:
        return None, None
    if value.lower() == "portable":
        return (f"{RETIRED_MODEL_IMPL_ENV}=portable: the portable K3 model has retired; SGLang's own K3 "
                f"(sglang.srt.models.kimi_k3) is the one model on every platform (unset {RETIRED_MODEL_IMPL_ENV})"), None
    return None, (f"{RETIRED_MODEL_IMPL_ENV}={value} is ignored: SGLang's own K3 is the one model (the portable "
                  f"model has retired); unset {RETIRED_MODEL_IMPL_ENV}")


def serving_env(d: Deployment | list[str], on_cpu: bool = True) -> dict[str, str]:
    """The server's environment for deployment `d` (or raw SGLang flags with on_cpu): the platform and
    `K3_DEPLOYMENT`, the decision itself."""
    d = _deployment(d, on_cpu)
    env = dict(os.environ)
    if env.get("SGLANG_EXTERNAL_MODEL_PACKAGE") == RETIRED_MODEL_PACKAGE:
        del env["SGLANG_EXTERNAL_MODEL_PACKAGE"]  # an inherited export must not swap SGLang's K3 out
    if d.k3_csv and d.pp > 1:
        env["SGLANG_ENABLE_PP_SPEC"] = "1"  # SGLang's pipeline speculation relay (spec/pp_hooks.py)
    if d.dtype == "float32":
        # SGLang keeps KDA conv windows in bf16 by default; a float32 model keeps them exact.
        env.setdefault("SGLANG_MAMBA_CONV_DTYPE", "float32")
    if d.on_cpu:
        env.setdefault("SGLANG_PLATFORM", "k3_cpu")
        env.pop("SGLANG_USE_CPU_ENGINE", None)
        cores = os.cpu_count() or 1
        env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(r % cores) for r in range(d.ranks)))
        if d.ranks > 1:  # SGLang sets no thread count on this platform: every rank would start one thread per core
            env.setdefault("OMP_NUM_THREADS", str(rank_threads(d.ranks)))
    else:
        env.pop("TRITON_INTERPRET", None)  # a GPU server never runs its Triton kernels in the CPU interpreter
    return {**env, **d.env()}


def rank_threads(ranks: int) -> int:
    """OpenMP/torch threads per rank so that `ranks` ranks share the cores this process may use (at least 1)."""
    return max(1, len(os.sched_getaffinity(0)) // ranks)


def env_changes(env: dict[str, str]) -> str:
    """The variables env sets or drops relative to this process, e.g. 'A=1 -B'."""
    changed = [f"{k}={v}" for k, v in sorted(env.items()) if os.environ.get(k) != v]
    return " ".join(changed + [f"-{k}" for k in sorted(os.environ) if k not in env])


def check_served(served: Deployment, cpu_env: dict[str, str] | None = None) -> None:
    """Raise CliError (exit 2) listing every reason SGLang's K3 cannot serve this deployment here (on the k3_cpu
    platform its limits table; on CUDA, K3_CSV against the verify contract); with cpu_env (a CPU host: the server's environment) also what HiCache cannot do there
    (hicache/serve_flags.py)."""
    from k3_sglang.cli import CliError
    from k3_sglang.serving.limits_table import deployment_refusals, refusal_message

    reasons = deployment_refusals(served, served.args, cpu_env)
    if reasons:
        raise CliError(refusal_message(served, reasons))


def run(args: argparse.Namespace) -> int:
    from k3_sglang.cli import CliError
    from k3_sglang.platform import cuda_available

    from k3_sglang.hicache.settings import HiCacheSettings
    from k3_sglang.worker_settings import WorkerSettings
    from k3_sglang.sglang_guard import GuardSettings, installed_sglang_version, version_refusal

    retired_error, retired_warning = retired_model_impl()
    if retired_error:
        raise CliError(retired_error)
    if retired_warning:
        print(f"k3 serve: warning: {retired_warning}", file=sys.stderr, flush=True)
    try:
        settings = ServeSettings.from_env()
        WorkerSettings.from_env()  # the workers' K3_* settings (K3_SPEC_* values included), read again there
        events = KvEventsSettings.from_env()
        RetentionSettings.from_env()  # read again in SGLang's scheduler (serving/retention.py)
        HiCacheSettings.from_env()  # read again there too (hicache/hooks.py, hicache/session_eviction_hooks.py)
        allowed = GuardSettings.from_env().allow_sglang_version
    except ValueError as exc:
        raise CliError(str(exc)) from None
    refusal = version_refusal(installed_sglang_version(), allowed)  # checked again in every server process
    if refusal:
        raise CliError(refusal)
    if not 0 < args.port < 65536:
        raise CliError(f"--port must be in 1..65535, got {args.port}")
    model_path = args.model_path or ensure_tiny_checkpoint(settings)
    validate_model_path(model_path)
    on_cpu = os.environ.get("SGLANG_PLATFORM") == "k3_cpu" or not cuda_available()
    try:  # the one parse of the user's SGLang flags (a --config YAML merged as SGLang merges it)
        user = Deployment.from_argv(args.extra_args, "k3_cpu" if on_cpu else "cuda", model_path)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    check_dynamic_chunking(model_path, user)
    missing = missing_transfer_engine(user)
    if missing:
        raise CliError(missing)
    # KV events on loopback (serving/kv_events_config.py); [] when the user configured them or turned them off
    ours, served = compose(model_path, args.host, args.port, user, kv_events_flags(user, events))
    late: list[str] = []
    if on_cpu:
        late += pd_cpu_flags(user)  # PD disaggregation on CPU (serving/pd_cpu.py); [] otherwise
        tier = cpu_host_tier(user, mem_available_bytes())  # sized from free memory; None: user's
        if tier is not None:
            print(f"k3 serve: {tier.message}", file=sys.stderr, flush=True)
        late += cpu_hicache_flags(user, tier)  # HiCache on CPU (hicache/serve_flags.py); [] otherwise
    argv = ours + list(args.extra_args) + late
    own_cache = own_cache_fields(user)
    if own_cache:
        print(f"k3 serve: note: {', '.join('--' + f.replace('_', '-') for f in own_cache)}: SGLang's own radix cache "
              "serves, without K3's KDA checkpoint events, session retention or session eviction",
              file=sys.stderr, flush=True)
    served = served.applied(late)
    env = hooks_env(serving_env(served))
    if on_cpu:
        env = cpu_hicache_env(served, args.host, pd_cpu_env(served, args.host, env))
    check_served(served, env if on_cpu else None)
    command = [sys.executable, "-m", "k3_sglang.serving.launch", *argv]
    if args.dry_run:
        where = "the k3_cpu platform, CPU kernels plugged into its seams" if on_cpu else "CUDA"
        print(f"# model: SGLang's K3 (sglang.srt.models.kimi_k3) on {where}")
        print(f"# environment: {env_changes(env) or 'unchanged'}")
        print(" ".join(command))
        return 0
    os.execvpe(command[0], command, env)
    return 0  # not reached
