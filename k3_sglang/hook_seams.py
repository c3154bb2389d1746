"""Why no public SGLang seam serves each private REPLACE or AROUND hook (issue 38, "fewer, safer hooks").

`NO_PUBLIC_SEAM` maps a hooked target (the dotted name k3_sglang/hook_inventory.py lists) to one line, read against
the installed SGLang 0.5.23: which extension point would have served and why it does not (missing, never read,
refuses a second entry, or keyed on something a plugin cannot set). The inventory shows it on every row of that
target, and tests/unit/test_hook_inventory.py fails on a REPLACE/AROUND row without one, on a reason shared by two
targets, and on a reason left here for a target no longer hooked. The public seams we do use are the inventory's
registry rows (S1...).
"""
from __future__ import annotations

_KDA = "sglang.srt.layers.attention.linear.kda_backend"
_GROUP = "sglang.srt.distributed.parallel_state.GroupCoordinator"
_DCP_KERNELS = "sglang.kernels.ops.attention.dcp_kernels"
_PP = "sglang.srt.managers.scheduler_pp_mixin"
_POOL_HOST = "sglang.srt.mem_cache.pool_host"

_COLLECTIVE = ("the custom op `reg_{op}`, which has no CPU kernel; the `_is_cpu` branch is taken only under "
               "SGLANG_USE_CPU_ENGINE (the Xeon engine), and the platform's `get_communicator_class` is marked "
               "[Planned] and read by nothing")

NO_PUBLIC_SEAM: dict[str, str] = {
    # -- every `k3 serve` process ---------------------------------------------------------------------------------
    # -- model overrides, DCP groups and pages (SGLang's K3 under DCP) ------------------------------------------------
    "sglang.srt.arg_groups.model_hook.collect_model_override_declarations":
        "`register_model_override(_predicate)` only appends providers; nothing removes or wraps SGLang's own K3 "
        "provider, which a CPU DCP layout must leave out or swap for the call",
    "sglang.srt.mem_cache.allocation._alloc_page_size":
        "it reads the widened DCP allocator page only under the import-time flags _is_hip/_is_cuda/_is_xpu/_is_npu; "
        "no platform method or capability reports it for an out-of-tree device",
    "sglang.srt.distributed.bootstrap.initialize_model_parallel":
        "`initialize_model_parallel` refuses decode context parallel unless is_hip()/is_cuda()/NPU/XPU by device "
        "name; `PlatformCapabilities` has no DCP field an out-of-tree platform could declare",
    f"{_GROUP}.all_gather_into_tensor": "off `is_cpu()` it always calls " + _COLLECTIVE.format(op="all_gather_into_tensor"),
    f"{_GROUP}.reduce_scatter_tensor": "off `is_cpu()` (and without deterministic inference or aiter) it calls "
                                       + _COLLECTIVE.format(op="reduce_scatter_tensor"),
    f"{_GROUP}.all_to_all_single": "it has no CPU branch at all: every multi-rank call goes to "
                                   + _COLLECTIVE.format(op="all_to_all_single"),
    f"{_DCP_KERNELS}.correct_attn_out":
        "a module function that launches its Triton kernel unconditionally (no BaseFusedOp, so "
        "`register_oot_forward` cannot reach it) from SGLang's ag_rs merge driver",
    f"{_DCP_KERNELS}.dcp_pack_a2a_send":
        "the a2a merge's send-slot scatter is a bare Triton launch imported by `dcp_a2a_lse_reduce`; no op registry "
        "or platform method selects it",
    f"{_DCP_KERNELS}.dcp_lse_combine_triton":
        "the a2a merge's LSE combine is named for and launches only its Triton kernel; SGLang has no torch twin or "
        "platform switch for it",
    "sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata":
        "the DCP extend planner builds its indices with Triton helpers on `get_device()` and SGLang's K3 model calls "
        "it by module name (kimi_k3.py); no platform or attention-backend method replaces it",
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton._launch_track_mamba_states":
        "the extra_buffer track copy always launches Triton from `track_mamba_states_if_needed`; the mamba pool is "
        "not among `get_kv_pool_cls` kinds and `support_mamba_cache_extra_buffer` is a yes/no only",
    # -- the k3_cpu platform, either model ----------------------------------------------------------------------------
    "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode":
        "it pins the mamba track mask with `.pin_memory()` directly instead of asking `is_pin_memory_available`, so "
        "the platform's False answer does not reach that call",
    "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func":
        "it takes torch only under `_is_cpu` (SGLANG_USE_CPU_ENGINE), Triton otherwise; "
        "`SRTPlatform.get_speculative_cache_locs_fn` exists but no caller in 0.5.23 reads it",
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify":
        "the post-verify state scatter calls its fused Triton scatters unconditionally, from SGLang's hybrid linear "
        "attention backend; a registered spec worker (CustomSpecAlgo) does not own that commit step",
    "sglang.srt.arg_groups.validation_hook.check_pipeline_parallel_compat":
        "the PP validation asserts EAGLE by name for any speculative algorithm; `CustomSpecAlgo.handle_server_args` "
        "is a separate step that cannot relax that assert",
    f"{_PP}._pp_exchange_outputs_before_forward":
        "a module function of the PP loop deciding exchange order from `spec_relay`; SchedulerPPMixin has no "
        "per-algorithm policy hook",
    f"{_PP}.SchedulerPPMixin._pp_prepare_tensor_dict":
        "the PP relay's tensor layout is fixed to EAGLE's fields (accept lens, draft top-k); CustomSpecAlgo has no "
        "relay serializer to register",
    f"{_PP}.SchedulerPPMixin._pp_prep_batch_result":
        "it reads the relayed speculative entries by EAGLE's per-tensor names; with no relay codec slot, K3_CSV's "
        "one packed tensor must be unpacked into a copy just before it",
    f"{_PP}.SchedulerPPMixin._pp_launch_batch":
        "CustomSpecAlgo's methods (create_worker, handle_server_args, ...) are consulted at start-up, not when a PP "
        "microbatch launches or its proxy is sent on, where K3_CSV's plan must ride",
    f"{_PP}.SchedulerPPMixin._pp_spec_rebuild_verify_input":
        "the relay rebuilds an EAGLE tree verify input on earlier stages; no spec-registry method builds a custom "
        "algorithm's verify input there",
    "sglang.srt.speculative.eagle_utils.eagle_prepare_for_verify":
        "PP+spec earlier stages call this EAGLE helper by module name for any algorithm; the speculative registry "
        "offers no prepare-for-verify slot",
    f"{_PP}.SchedulerPPMixin._pp_spec_commit_relayed_accept":
        "the relayed accept commit is EAGLE's; no registry callback lets K3_CSV's drafter observe the accept lens "
        "on the first stage",
    # -- the k3_cpu platform, SGLang's own K3 --------------------------------------------------------------------------
    "sglang.srt.models.kimi_k3.KimiK3LinearModel.__init__":
        "the constructor builds `torch.cuda.Stream()`s unless `_is_hip`; `post_load_model` runs only after it "
        "returns, and a subclass through the model package would still run (or have to copy) this constructor",
    "triton_kernels.numerics_details.mxfp.upcast_from_mxfp":
        "SGLang's MXFP4 MoE method imports triton_kernels' upcast inside `process_weights_after_loading`; "
        "`get_quantization_config` would need a copy of that whole method, and `post_load_model` comes after it",
    f"{_KDA}.KDAKernelDispatcher.__init__":
        "attention_registry builds KDAAttnBackend by name for Kimi configs, and its dispatcher has no kernel "
        "registry: `--linear-attn-verify-backend custom` raises 'no custom KDA verify kernel is registered yet'",
    f"{_KDA}.causal_conv1d_fn":
        "kda_backend binds causal_conv1d_fn from the Triton module at import, with NPU/`is_cpu()` overrides only for "
        "the update; no platform or registry picks the prefill conv",
    f"{_KDA}.causal_conv1d_update":
        "its decode conv is swapped at import only for NPU or `is_cpu()` (sgl_kernel's AMX op); an out-of-tree "
        "platform cannot choose it",
    "sglang.srt.layers.attn_residual._mix_fused":
        "the AttnRes mix chooses NPU or Triton inside a module function; no BaseFusedOp or platform method lets a "
        "CPU implementation in",
    "sglang.srt.layers.moe.moe_runner.base.FusedOpPool.get_fused_func":
        "`register_fused_func` refuses a second entry, SGLang registers ('none', 'triton') itself, and MoeRunner "
        "prefers the fused function over our registered runner core",
    "sglang.srt.mem_cache.allocation.get_last_loc":
        "it picks Triton by attention-backend name (only 'ascend'/'torch_native' go torch), not by "
        "`capabilities.supports_triton`, which our platform already answers False",
    # -- HiCache on the k3_cpu platform -----------------------------------------------------------------------------------
    f"{_POOL_HOST}.base.HostKVCache.__init__":
        "MLA host pools default to `pin_memory=True` and the assembler passes no pin choice (the platform's "
        "`is_pin_memory_available` is not read there); `hicache_device_kernels` only skips staging buffers",
    f"{_POOL_HOST}.mamba.MambaPoolHost.__init__":
        "MambaPoolHost defaults to pinned buffers and is built by `build_hybrid_mamba_stack`, which passes no "
        "platform pin choice",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_hybrid_mamba_stack":
        "pool_host.mla/mamba import the `direct` transfer ops from sgl_kernel on CUDA only; no registry supplies "
        "transfer ops to host pools",
    f"{_POOL_HOST}.base.host_memory_budget_bytes":
        "the host budget subtracts the module constant HICACHE_HOST_MEMORY_RESERVE_BYTES (10 GiB); no server "
        "argument, environment variable or platform method sets it",
    f"{_POOL_HOST}.common.alloc_with_host_register":
        "the host allocator is picked by storage-backend name in `get_allocator_from_storage` (no registry), and the "
        "default `alloc_mmap` maps with MAP_POPULATE, so a whole tier is committed at start; no platform method is asked",
    "sglang.srt.managers.cache_controller.storage_model_name":
        "storage backends key L3 objects on this name plus TP/PP ranks (hicache_storage.py's `_{model}_{rank}_"
        "{size}` suffix); nothing else that wrote them (checkpoint, page size, DCP, version) reaches the key",
    f"{_POOL_HOST}.mamba.MambaPoolHost.load_to_device_per_layer":
        "tests' sabotage only (K3_HICACHE_FAULT): a fault injected inside SGLang's own restore path, which no "
        "public seam exposes by design",
    # -- K3_CSV's plain path (spec/plain_path.py), any platform ---------------------------------------------------------
    "sglang.srt.managers.scheduler.Scheduler.update_running_batch":
        "a batch's speculative or plain path is fixed by `ScheduleBatch.spec_algorithm`, which the scheduler copies "
        "from its own; no spec-algorithm or worker callback runs before `prepare_for_decode`, where the decode "
        "allocation of the two paths differs",
    # -- measurement (K3_STEP_TIMING) ------------------------------------------------------------------------------------
    "sglang.srt.managers.scheduler.Scheduler.run_batch":
        "the event loops call `run_batch` directly and the Scheduler offers no per-step callback or plugin slot; "
        "its metrics are aggregates, not one record per decode step with its start time",
    "sglang.srt.model_executor.model_runner.ModelRunner.forward":
        "`--forward-hooks` time model modules only, not ModelRunner's metadata and backend preparation, which the "
        "step timer's 'fwd' includes",
}



def reason(target: str) -> str:
    """The one line why no public seam serves `target` ("" when none is recorded)."""
    return NO_PUBLIC_SEAM.get(target, "")
