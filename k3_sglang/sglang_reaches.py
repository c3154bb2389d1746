"""Every reach into SGLang (or torch) that is not a HookRegistry hook: attributes swapped or bound, private names read
or edited, attributes added to SGLang objects, fields of SGLang objects written, SGLang classes subclassed, an SGLang
enum value reused, `SGLANG_*` environment variables set, and a call bound by SGLang's parameter names.

k3_sglang/hook_inventory.py renders these rows after the hooks; tests/unit/test_hook_inventory.py checks that every
reach the static scan (k3_sglang/sglang_uses.py) finds has a row here, that every target resolves in the installed
SGLang, and k3_sglang/sglang_fingerprints.json (`k3 hooks check`) that none changed since SGLang 0.5.23 was read.

`seam`: "public" where SGLang offers the thing as an extension point (a base class its registries take, a variable
its `envs` declares), "private" where we depend on an internal.
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("SCOPED_SETATTR", "SETATTR", "PRIVATE_EDIT", "PRIVATE_READ", "ATTR_ADD", "FIELD_WRITE", "SUBCLASS",
         "OVERRIDE", "ENUM_REUSE", "ENV", "SIGNATURE_BIND")


@dataclass(frozen=True)
class Reach:
    """One row: target (dotted path, or an SGLANG_* variable), kind (KINDS), owner module(s) joined by ", ", seam
    ("public"/"private"), the test that exercises it, why; `fingerprint`: the dotted paths whose signature and
    source `k3 hooks check` watches (default: the target itself; () for an environment variable)."""

    target: str
    kind: str
    owner: str
    seam: str
    test: str
    why: str
    fingerprint: tuple[str, ...] | None = None

    @property
    def owners(self) -> tuple[str, ...]:
        return tuple(o.strip() for o in self.owner.split(","))

    @property
    def watched(self) -> tuple[str, ...]:
        if self.fingerprint is not None:
            return self.fingerprint
        return () if self.kind == "ENV" else (self.target,)


_PS = "sglang.srt.distributed.parallel_state"
_GC = f"{_PS}.GroupCoordinator"
_MO = "sglang.srt.arg_groups.model_override_base._MODEL_OVERRIDE_FNS"
_URC = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
_KDA = "sglang.srt.layers.attention.linear.kda_backend.KDAKernelDispatcher"
_DCP = "k3_sglang.dcp_mla.overrides"
_UTC = "sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore"
_RC, T_RC = "k3_sglang.serving.radix_cache", "tests/unit/test_radix_cache.py"
T_PLAT, T_DCP, T_HIC = "tests/unit/test_platform_hooks.py", "tests/unit/test_dcp_mla_hooks.py", \
    "tests/unit/test_hicache_hooks.py"
T_KV, T_CPU, T_SPEC = "tests/unit/test_kv_event_hooks.py", "tests/unit/test_sglang_cpu_moe_and_shims.py", \
    "tests/spec/test_spec_worker_parts.py"
T_GUARD, T_SERVE, T_PD = "tests/unit/test_sglang_guard.py", "tests/unit/test_serve_cli.py", "tests/e2e/test_pd_serve.py"

REACHES = (
    # -- attributes swapped for the duration of one call (restored after it) --------------------------------------
    Reach(f"{_PS}.is_cuda", "SCOPED_SETATTR", "k3_sglang.platform_hooks", "private", T_PLAT,
          "answers True during initialize_model_parallel so its DCP platform check passes on CPU"),
    Reach("torch.Tensor.pin_memory", "SCOPED_SETATTR", "k3_sglang.platform_hooks", "private", T_PLAT,
          "the identity during ScheduleBatch.prepare_for_decode (its unconditional pin raises without a driver)",
          ("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode",)),
    Reach("torch.cuda.Stream", "SCOPED_SETATTR", "k3_sglang.sglang_cpu.shims", "private", T_CPU,
          "returns None during KimiK3LinearModel.__init__ (no CUDA streams on CPU)",
          ("sglang.srt.models.kimi_k3.KimiK3LinearModel.__init__",)),
    Reach("sglang.srt.mem_cache.pool_host.base.HICACHE_HOST_MEMORY_RESERVE_BYTES", "SCOPED_SETATTR",
          "k3_sglang.hicache.hooks", "private", T_HIC,
          "a 1 GiB host reserve instead of 10 GiB during a host pool's allocation check",
          ("sglang.srt.mem_cache.pool_host.base",)),
    # -- attributes bound for the life of the process ---------------------------------------------------------------
    Reach("sglang.srt.mem_cache.pool_host.{mla,mamba}.<direct transfer ops>", "SETATTR", "k3_sglang.hicache.hooks",
          "private", T_HIC, "torch versions of the three `direct` copy ops, which those modules import from "
          "sgl_kernel on CUDA only (bound only where the name is missing)",
          ("sglang.srt.mem_cache.pool_host.mla", "sglang.srt.mem_cache.pool_host.mamba")),
    Reach("sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks", "SETATTR", "k3_sglang.sglang_guard", "private",
          T_GUARD, "wrapped (where K3 is in play) to prove every hook of ours applied and every plugin completed: "
          "SGLang only logs those failures"),
    # -- private names read or edited ------------------------------------------------------------------------------
    Reach("sglang.srt.plugins.hook_registry.HookRegistry._hooks", "PRIVATE_READ", "k3_sglang.sglang_guard", "private",
          T_GUARD, "the hooks registered, to find ours and prove each applied", ("sglang.srt.plugins.hook_registry",)),
    Reach("sglang.srt.plugins.hook_registry.HookRegistry._patched", "PRIVATE_READ", "k3_sglang.sglang_guard",
          "private", T_GUARD, "the targets SGLang patched (a failed one is only logged)",
          ("sglang.srt.plugins.hook_registry",)),
    Reach("sglang.srt.mem_cache.unified_cache.components.base._LAST_ACCESS_TIME_COUNTER_FLOAT", "PRIVATE_READ",
          "k3_sglang.hicache.session_eviction_hooks", "private", "tests/unit/test_hicache_session_eviction.py",
          "the tree's logical access clock, read to map node access stamps to request times (session eviction)",
          ("sglang.srt.mem_cache.unified_cache.components.base.get_and_increase_time_counter",)),
    Reach("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore._evict_host_leaf", "PRIVATE_READ",
          "k3_sglang.hicache.session_eviction_hooks", "private", "tests/unit/test_hicache_session_eviction.py",
          "evicts one host leaf (all components) in the order the session policy picks; also reads "
          "`evictable_host_leaves`, `is_write_back`, `enable_session_radix_cache`"),
    Reach("sglang.srt.plugins._plugins_loaded", "PRIVATE_READ", "k3_sglang.sglang_guard", "private", T_GUARD,
          "whether load_plugins ran, so a plugin of ours that never completed is named",
          ("sglang.srt.plugins.load_plugins",)),
    Reach(_MO, "PRIVATE_EDIT", _DCP, "private", T_DCP,
          "K3's provider list, edited in place for one call to leave out or swap SGLang's GPU-only DCP provider",
          (_MO, "sglang.srt.arg_groups.model_hook.collect_model_override_declarations")),
    Reach("sglang.srt.arg_groups.model_overrides.kimi_k3._kimi_k3_overrides", "PRIVATE_READ", _DCP, "private", T_DCP,
          "the provider found in that list by its private __name__"),
    Reach("sglang.srt.layers.moe.moe_runner.runner._CUSTOM_RUNNER_CORE_FACTORIES", "PRIVATE_READ",
          "k3_sglang.sglang_cpu.moe_runner", "private", T_CPU,
          "read so our runner core registers once per process (register_moe_runner_core refuses a second)",
          ("sglang.srt.layers.moe.moe_runner.runner.register_moe_runner_core",)),
    Reach("sglang.srt.layers.attn_residual._BLOCK_H", "PRIVATE_READ", "k3_sglang.sglang_cpu.shims", "private", T_CPU,
          "the combine kernel's block width: a hidden size not a multiple of it takes SGLang's eager path",
          ("sglang.srt.layers.attn_residual._mix_fused",)),
    Reach(f"{_GC}._all_gather_into_tensor", "PRIVATE_READ", "k3_sglang.dcp_mla.cpu_kernels", "private", T_DCP,
          "the coordinator's torch.distributed all-gather, called for CPU tensors (no CPU custom op)"),
    Reach(f"{_GC}._reduce_scatter_tensor", "PRIVATE_READ", "k3_sglang.dcp_mla.cpu_kernels", "private", T_DCP,
          "the coordinator's torch.distributed reduce-scatter, called for CPU tensors"),
    Reach(f"{_GC}._all_to_all_single", "PRIVATE_READ", "k3_sglang.dcp_mla.cpu_kernels", "private", T_DCP,
          "the coordinator's torch.distributed all-to-all, called for CPU tensors"),
    Reach("sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata", "SIGNATURE_BIND",
          "k3_sglang.dcp_mla.cpu_kernels", "private", "tests/unit/test_sglang_fingerprints.py",
          "its 11 arguments bound by SGLang's own parameter names (inspect.signature), never by position"),
    Reach("sglang.srt.entrypoints.http_server.launch_server", "SIGNATURE_BIND", "k3_sglang.serving.launch", "public",
          "tests/unit/test_hook_inventory.py",
          "called as run_server's default HTTP mode does, with its public launch_callback keyword (the ready line); "
          "run_server's mode flags are read to send every other mode to run_server itself",
          fingerprint=("sglang.srt.entrypoints.http_server.launch_server", "sglang.launch_server.run_server")),
    # -- attributes added to SGLang objects, fields written ----------------------------------------------------------
    Reach(f"{_KDA}.__init__", "FIELD_WRITE", "k3_sglang.sglang_cpu.shims", "private", T_CPU,
          "six fields overwritten after SGLang's constructor: triton/decode/verify/extend_kernel = our torch kernel, "
          "supports_packed_decode(_safe_gate) = False"),
    Reach("sglang.srt.managers.schedule_batch.ScheduleBatch", "FIELD_WRITE", "k3_sglang.spec.batch_prep", "private",
          T_SPEC, "forward_mode, input_ids, out_cache_loc, seq_lens(_cpu/_sum), spec_info rewritten for K3_CSV's "
          "plain-decode and verify steps"),
    Reach("sglang.srt.managers.schedule_batch.ScheduleBatch.spec_algorithm", "FIELD_WRITE",
          "k3_sglang.spec.plain_path", "private", "tests/spec/test_plain_path.py",
          "the running batch's algorithm set to NONE for a step K3_CSV runs as plain decode (and back), with its "
          "spec_info cleared and orig_seq_lens realigned, so SGLang prepares, runs and reads that step as without "
          "speculation", ("sglang.srt.managers.schedule_batch.ScheduleBatch",)),
    Reach("sglang.srt.managers.schedule_batch.ReqKvInfo.kv_allocated_len", "FIELD_WRITE",
          "k3_sglang.spec.plain_path", "private", "tests/spec/test_plain_path.py",
          "lowered to kv_committed_len after the speculative reserve past it is freed (`free_kv_row`), the state "
          "SGLang's non-speculative decode allocation expects", ("sglang.srt.managers.schedule_batch.ReqKvInfo",)),
    # -- subclasses and enum values ---------------------------------------------------------------------------------
    Reach("sglang.srt.disaggregation.kv_events.KVCacheEvent", "SUBCLASS", "k3_sglang.serving.kv_event_hooks",
          "private", T_KV, "two new tagged event types (KDA_STORED, KDA_REMOVED) in SGLang's event union"),
    Reach("sglang.srt.disaggregation.kv_events.ZmqEventPublisher", "SUBCLASS", "k3_sglang.serving.kv_events_curve",
          "private", "tests/router/test_event_curve.py", "the CURVE publisher (registered through "
          "EventPublisherFactory.register_publisher) overrides its private _socket_setup"),
    Reach("sglang.srt.disaggregation.kv_events.ZmqEventPublisher._ctx", "FIELD_WRITE",
          "k3_sglang.serving.kv_events_curve", "private", "tests/router/test_event_curve.py",
          "the publisher's private ZMQ context replaced by a CURVE-server context before SGLang's socket setup; "
          "_k3_auth added beside it", ("sglang.srt.disaggregation.kv_events.ZmqEventPublisher._socket_setup",)),
    Reach("sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel", "SUBCLASS",
          "k3_sglang.sglang_cpu.kda_kernel", "private", "tests/unit/test_sglang_cpu_kda_ops.py",
          "our torch KDA kernel takes the Triton kernel's interface (the dispatcher has no registry)"),
    Reach("sglang.srt.speculative.ngram_info.NgramVerifyInput", "SUBCLASS", "k3_sglang.spec.info", "private", T_SPEC,
          "K3_CSV's between-steps state keeps the NGRAM worker's layout"),
    Reach("sglang.srt.speculative.spec_info.SpecInputType.NGRAM_VERIFY", "ENUM_REUSE", "k3_sglang.spec.info",
          "private", T_SPEC, "K3's verify input presents itself as NGRAM_VERIFY (SGLang branches on that tag)",
          ("sglang.srt.speculative.spec_info.SpecInputType",)),
    Reach("sglang.srt.speculative.spec_info.SpecInput", "SUBCLASS", "k3_sglang.spec.info", "public", T_SPEC,
          "K3's verify input, the base SGLang's speculative registry takes"),
    Reach("sglang.srt.speculative.spec_registry.CustomSpecAlgo", "SUBCLASS", "k3_sglang.spec.algo", "public", T_SPEC,
          "the K3_CSV algorithm, through SpeculativeAlgorithm.register"),
    Reach("sglang.srt.speculative.base_spec_worker.BaseSpecWorker", "SUBCLASS", "k3_sglang.spec.worker", "public",
          T_SPEC, "the K3_CSV worker the registered factory returns"),
    Reach("sglang.srt.layers.attention.base_attn_backend.AttentionBackend", "SUBCLASS",
          "k3_sglang.dcp_mla.backend, k3_sglang.sglang_cpu.mla_backend", "public", "tests/unit/test_dcp_mla_backend.py",
          "the k3_dcp_mla and k3_cpu_mla backends, through SGLang's attention registry"),
    Reach("sglang.srt.layers.moe.moe_runner.base.DispatchMoeRunnerCore", "SUBCLASS", "k3_sglang.sglang_cpu.moe_runner",
          "public", T_CPU, "the CPU MoE runner core, through register_moe_runner_core"),
    Reach("sglang.srt.mem_cache.memory_pool.MLATokenToKVPool", "SUBCLASS", "k3_sglang.sglang_cpu.mla_pool", "public",
          "tests/model/test_dcp_cpu_kernels.py",
          "the k3_cpu platform's MLA pool (get_mla_kv_buffer reads CPU rows in torch), through SRTPlatform."
          "get_kv_pool_cls(kind='mla')",
          fingerprint=("sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.get_mla_kv_buffer",
                       "sglang.srt.platforms.interface.SRTPlatform.get_kv_pool_cls")),
    Reach("sglang.srt.layers.quantization.compressed_tensors.compressed_tensors.CompressedTensorsConfig", "SUBCLASS",
          "k3_sglang.sglang_cpu.quant_config", "public", "tests/unit/test_sglang_cpu_hooks.py",
          "the k3_cpu platform's compressed-tensors config (float32 activations accepted), through SRTPlatform."
          "get_quantization_config",
          fingerprint=("sglang.srt.layers.quantization.compressed_tensors.compressed_tensors.CompressedTensorsConfig"
                       ".get_supported_act_dtypes", "sglang.srt.layers.quantization.get_quantization_config")),
    Reach("sglang.srt.platforms.interface.SRTPlatform", "SUBCLASS", "k3_sglang.platform_cpu", "public",
          "tests/unit/test_server_process.py", "the k3_cpu platform, through the sglang.srt.platforms entry point"),
    Reach("sglang.srt.platforms.cpu.CpuDeviceMixin", "SUBCLASS", "k3_sglang.platform_cpu", "public",
          "tests/unit/test_server_process.py", "SGLang's CPU device behaviour for the k3_cpu platform"),
    Reach("sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod", "SUBCLASS",
          "k3_sglang.sglang_cpu.cpu_layers", "public", "tests/unit/test_sglang_cpu_layers.py",
          "K3CpuLinearMethod (small CPU GEMMs in float32): each of the model's methods takes it in place, in the "
          "platform's post_load_model", ("sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
                                         "sglang.srt.platforms.interface.SRTPlatform.post_load_model")),
    Reach("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated", "SUBCLASS",
          "k3_sglang.sglang_cpu.cpu_layers", "public", "tests/unit/test_sglang_cpu_layers.py",
          "K3CpuFusedRMSNormGated (KDA's gated output norm in torch): each such module takes it in place, in the "
          "platform's post_load_model",
          ("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward",
           "sglang.srt.platforms.interface.SRTPlatform.post_load_model")),
    # -- the `k3` radix cache: subclasses SGLang builds through its registries, and the methods they override ------
    Reach(_URC, "SUBCLASS", _RC, "public", T_RC,
          "K3RadixCache, built by SGLang's create_unified_radix_cache(cache_class=...) for `--radix-cache-backend k3` "
          "(register_radix_cache_backend)",
          (_URC, "sglang.srt.mem_cache.registry.create_unified_radix_cache",
           "sglang.srt.mem_cache.registry.create_tree_cache")),
    Reach(_UTC, "SUBCLASS", _RC, "public", T_RC,
          "K3SessionTreeCore, SGLang's Python TreeCore for one cache under session eviction "
          "(register_tree_core_backend, CacheInitParams.tree_core_backend)",
          (_UTC + ".__init__", "sglang.srt.mem_cache.unified_cache.tree_core_registry.select_tree_core_backend")),
    Reach(f"{_URC}.insert", "OVERRIDE", _RC, "public", T_RC,
          "KDA checkpoint stored: after SGLang's insert kept a request's state (serving/kv_event_hooks.py)"),
    Reach(f"{_URC}.take_events", "OVERRIDE", _RC, "public", T_RC,
          "our queued KDA events first, in the batch SGLang's publisher takes"),
    Reach(f"{_URC}.reset", "OVERRIDE", _RC, "public", T_RC, "the KDA slot map and the retention book forgotten"),
    Reach(f"{_URC}.load_back", "OVERRIDE", _RC, "public", T_RC,
          "KDA checkpoint loaded back from the host tier (serving/kv_event_tiers.py)"),
    Reach(f"{_URC}.checkpoint_into_tree", "OVERRIDE", _RC, "public", T_RC,
          "a finished turn's retention booked (serving/retention.py)"),
    Reach(f"{_URC}.match_prefix", "OVERRIDE", _RC, "public", T_RC,
          "the session eviction's access clock sampled (hicache/session_eviction_hooks.py)"),
    Reach(f"{_URC}._apply_cache_action", "OVERRIDE", _RC, "private", T_RC,
          "KDA checkpoint removed: a MAMBA FreeComponentDeviceSlot seen before SGLang applies it (the one path by "
          "which a tree state slot is freed); no public seam: SGLang's KV events carry token blocks only, and no "
          "callback fires when a state slot is freed"),
    Reach(f"{_URC}._execute_kv_backup", "OVERRIDE", _RC, "private", T_RC,
          "KDA checkpoint stored in the host tier: the MAMBA host slots a node's backup got; no public seam: those "
          "slot ids exist only inside this call, and a backup raises no event for KDA states"),
    Reach(f"{_URC}._drain_host_frees", "OVERRIDE", _RC, "private", T_RC,
          "KDA checkpoint removed from the host tier (SGLang's one caller of MambaComponent.free_host_values); no "
          "public seam: a freed host slot raises no event"),
    Reach(f"{_URC}._evict", "OVERRIDE", _RC, "private", T_RC,
          "expired retentions released before SGLang evicts; no public seam: eviction has no callback, and an expired "
          "lock matters only then"),
    Reach(f"{_UTC}.drive_host_eviction", "OVERRIDE", _RC, "public", "tests/unit/test_hicache_session_eviction.py",
          "the host tier evicts whole paused sessions first, SGLang's own pass for the rest"),
    # -- SGLANG_* environment variables set (public: declared in sglang.srt.environ) --------------------------------
    Reach("SGLANG_PLATFORM", "ENV", "k3_sglang.serving.cli", "public", T_SERVE, "selects the k3_cpu platform on CPU"),
    Reach("SGLANG_ENABLE_PP_SPEC", "ENV", "k3_sglang.serving.cli", "public", "tests/spec/test_pp_hooks.py",
          "SGLang's pipeline speculation relay for K3_CSV under --pp-size > 1"),
    Reach("SGLANG_MAMBA_CONV_DTYPE", "ENV", "k3_sglang.serving.cli", "public", T_SERVE,
          "float32 KDA conv windows for a float32 model"),
    Reach("SGLANG_CPU_OMP_THREADS_BIND", "ENV", "k3_sglang.serving.cli", "private", T_SERVE,
          "one core per rank (read by SGLang's CPU worker, not declared in its envs)"),
    Reach("SGLANG_USE_CPU_ENGINE", "ENV", "k3_sglang.serving.cli", "private", T_SERVE,
          "removed from the server's environment: the Xeon engine must not take the k3_cpu platform's place"),
    Reach("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER", "ENV", "k3_sglang.serving.pd_cpu", "public", T_PD,
          "PD on CPU: every DCP rank transfers its KV slice"),
    Reach("SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX", "ENV", "k3_sglang.serving.pd_cpu", "public", T_PD,
          "PD on CPU: no early send of a cached prefix"),
    Reach("SGLANG_HOST_IP", "ENV", "k3_sglang.serving.pd_cpu", "private", T_PD,
          "PD on CPU: the loopback address Mooncake advertises (not declared in SGLang's envs)"),
    Reach("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "ENV", "k3_sglang.launch.commands", "public",
          "tests/launch/test_launch_render.py", "rendered PD launch scripts: Mooncake's custom memory pool"),
    Reach("SGLANG_PP_LAYER_PARTITION", "ENV", "k3_sglang.launch.commands", "private",
          "tests/launch/test_launch_render.py", "rendered launch scripts: the planner's layer split per PP stage "
          "(read by SGLang's get_pp_indices, not declared in its envs)"),
    Reach("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "ENV", "k3_sglang.tooling.bench.sessions", "public",
          "tests/unit/test_sessions_bench.py", "`k3 bench sessions`' restart arm: its file store's directory"),
    Reach("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "ENV", "k3_sglang.tooling.router.pd_bench", "public",
          "tests/router/test_pd_router.py", "the PD benchmark's servers: a bounded bootstrap wait"),
    Reach("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "ENV", "k3_sglang.tooling.router.pd_bench", "public",
          "tests/router/test_pd_router.py", "the PD benchmark's servers: a bounded transfer wait"),
)
