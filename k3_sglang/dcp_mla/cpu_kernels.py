"""Torch equivalents of the Triton helpers SGLang's DCP path calls, for CPU tensors (the k3_cpu platform), and the
AROUND hooks that route CPU tensors to them (every other device keeps SGLang's kernel).

Each function computes what the Triton kernel it stands for computes (same inputs, same outputs, the same
NaN/-inf rules), so SGLang's own merge drivers (`cp_lse_ag_out_rs_mla`, `dcp_a2a_lse_reduce`) and extend planner
(`prepare_decode_context_parallel_metadata`) run unchanged around them:
- `correct_attn_out` (ag_rs merge): each rank's partial scaled by exp(lse_r - LSE), written head-major [H, B, D];
- `dcp_pack_a2a_send` / `dcp_lse_combine_triton` (a2a merge): the send-slot scatter and the LSE-weighted combine;
- `prepare_decode_context_parallel_metadata` (extend under DCP): the gathered-buffer indices (the pool read that
  gathers this rank's prefix rows for it, `read_mla_rows_torch`, is the k3_cpu platform's MLA pool's own read:
  sglang_cpu/mla_pool.py, through SGLang's public `get_kv_pool_cls`);
- `_launch_track_mamba_states` (extra_buffer prefix cache): the decode-time copy of KDA states into track slots;
- `GroupCoordinator.all_gather_into_tensor` / `reduce_scatter_tensor` / `all_to_all_single`: on an out-of-tree
  platform (`is_cpu()` False) these call SGLang's registered custom ops, which have no CPU kernel; for CPU tensors
  the hooks call the coordinator's own torch.distributed paths (`_all_gather_into_tensor`, ...), what its `_is_cpu`
  branch does.
"""
from __future__ import annotations

import inspect

import torch

_NEG_INF = float("-inf")


def _clean(lse: torch.Tensor) -> torch.Tensor:
    """NaN and +inf -> -inf (what the kernels do before using an LSE)."""
    return torch.where(torch.isnan(lse) | torch.isposinf(lse), _NEG_INF, lse)


def _exp(x: torch.Tensor, base_e: bool) -> torch.Tensor:
    return torch.exp(x) if base_e else torch.exp2(x)


def _log(x: torch.Tensor, base_e: bool) -> torch.Tensor:
    return torch.log(x) if base_e else torch.log2(x)


def _global_lse(lses: torch.Tensor, base_e: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """lses [N, ...] -> (LSE [...], the max shift used), the kernels' max-shifted log-sum-exp."""
    lses = _clean(lses.float())
    top = lses.max(0).values
    top = torch.where(torch.isneginf(top), 0.0, top)
    return _log(_exp(lses - top, base_e).sum(0), base_e) + top, top


def correct_attn_out_torch(out: torch.Tensor, lses: torch.Tensor, cp_rank: int, new_output: torch.Tensor,
                           is_lse_base_on_e: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """out [B, H, D] (or [B, 1, H, D]) this rank's partial, lses [N, B, H] (a size-1 dim allowed) all ranks' LSEs,
    new_output [H, B, D] fp32 -> (new_output = out * exp(lse_rank - LSE) head-major, LSE [B, H])."""
    if out.dim() == 4 and out.shape[1] == 1:
        out = out.squeeze(1)
    if lses.dim() == 4 and lses.shape[-1] == 1:
        lses = lses.squeeze(-1)
    if lses.dim() == 4 and lses.shape[1] == 1:
        lses = lses.squeeze(1)
    final, _ = _global_lse(lses, is_lse_base_on_e)
    diff = lses[cp_rank].float() - final
    diff = torch.where(torch.isnan(diff) | torch.isposinf(diff), _NEG_INF, diff)
    factor = _exp(diff, is_lse_base_on_e)  # [B, H]
    new_output.copy_((out.float() * factor[..., None]).transpose(0, 1))
    return new_output, final.to(lses.dtype)


def pack_a2a_send_torch(cp_attn_out: torch.Tensor, cp_attn_lse: torch.Tensor, dst_o: torch.Tensor,
                        dst_lse: torch.Tensor) -> None:
    """Scatter [B, H, D] partials and [B, H] fp32 LSEs into send slots dst_o [N, B_max, H/N, D], dst_lse
    [N, B_max, H/N] (any strides; rows beyond B untouched): head h goes to peer h // (H/N)."""
    b, h, d = cp_attn_out.shape
    n, b_max, h_per = dst_lse.shape
    if cp_attn_lse.dtype != torch.float32 or dst_lse.dtype != torch.float32:
        raise ValueError("LSE tensors must be float32")
    if tuple(dst_o.shape) != (n, b_max, h_per, d) or h_per * n != h or b > b_max:
        raise ValueError(f"destination {tuple(dst_o.shape)} / {tuple(dst_lse.shape)} does not match out "
                         f"{tuple(cp_attn_out.shape)}")
    dst_o[:, :b].copy_(cp_attn_out.view(b, n, h_per, d).transpose(0, 1))
    dst_lse[:, :b].copy_(cp_attn_lse.view(b, n, h_per).transpose(0, 1))


def lse_combine_torch(recv_output: torch.Tensor, recv_lse: torch.Tensor, is_lse_base_on_e: bool = True,
                      return_lse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """recv_output [N, B, H, D], recv_lse [N, B, H] -> (sum_i w_i o_i / max(sum_i w_i, 1) [B, H, D] in
    recv_output.dtype, LSE [B, H] or None), w_i = exp(lse_i - max lse)."""
    lses = _clean(recv_lse.float())
    top = lses.max(0).values
    top = torch.where(torch.isneginf(top), 0.0, top)
    w = _exp(lses - top, is_lse_base_on_e)  # [N, B, H]
    total = w.sum(0)
    acc = (recv_output.float() * w[..., None]).sum(0) / torch.clamp(total, min=1.0)[..., None]
    lse = (_log(total, is_lse_base_on_e) + top).to(recv_lse.dtype) if return_lse else None
    return acc.to(recv_output.dtype), lse


def extend_gather_metadata_torch(seq_lens, extend_prefix_lens, extend_prefix_lens_cpu, extend_seq_lens,
                                 req_pool_indices, req_to_token, seq_lens_sum, kv_buffer_shape, kv_cache_dtype,
                                 kv_cache_device):
    """SGLang's `prepare_decode_context_parallel_metadata` without its Triton index kernels: the gathered buffer
    [seq_lens_sum, *row] (all prefixes, request after request, then all chunks), dcp_kv_indices (each request's
    rows in that buffer, position order), and this rank's prefix rows of the pool (positions p = rank mod c, read at
    physical row v // c)."""
    from sglang.srt.layers.dcp.metadata import DecodeContextParallelMetadata
    from sglang.srt.model_executor.forward_context import get_attn_backend
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if not parallel.dcp_enabled:
        return None
    prefix = [int(p) for p in extend_prefix_lens_cpu]
    chunk = extend_seq_lens.long().tolist()
    slots = req_pool_indices.long().tolist()
    prefix_sum = sum(prefix)
    cu_prefix, cu_chunk, kv_indices, mine = 0, 0, [], []
    for slot, p, n in zip(slots, prefix, chunk):
        kv_indices += [torch.arange(cu_prefix, cu_prefix + p), torch.arange(prefix_sum + cu_chunk,
                                                                            prefix_sum + cu_chunk + n)]
        mine.append(req_to_token[slot, parallel.dcp_rank: p: parallel.dcp_size])
        cu_prefix, cu_chunk = cu_prefix + p, cu_chunk + n
    dev = seq_lens.device
    kv_indptr = torch.zeros(len(slots) + 1, dtype=torch.int32, device=dev)
    kv_indptr[1:] = seq_lens.cumsum(0)
    widened = torch.cat(mine) if mine else req_to_token.new_zeros(0)
    return DecodeContextParallelMetadata(
        dcp_kv_indptr=kv_indptr,
        dcp_kv_buffer=torch.empty((seq_lens_sum, *kv_buffer_shape[1:]), dtype=kv_cache_dtype, device=kv_cache_device),
        dcp_kv_indices=torch.cat(kv_indices).to(torch.int32).to(dev) if kv_indices else kv_indptr.new_zeros(0),
        dcp_local_prefix_kv_indices=get_attn_backend().kv_index_translator.translate_dcp_read_ids(
            widened.to(torch.int32)),
        dcp_extend_prefix_lens_sum=prefix_sum,
    )


def read_mla_rows_torch(kv_buffer: torch.Tensor, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                        cache_k_rope: torch.Tensor | None = None) -> None:
    """kv_buffer [N, 1, L] pool rows, loc [n] row ids -> cache_k_nope [n, 1, C] (and cache_k_rope [n, 1, R]) = the
    rows' first C (next R) values, cast to the outputs' dtype."""
    rows = kv_buffer.reshape(kv_buffer.shape[0], -1)[loc.long()]
    nope = cache_k_nope.shape[-1]
    cache_k_nope.copy_(rows[:, :nope].view(cache_k_nope.shape))
    if cache_k_rope is not None and cache_k_rope.numel() > 0:
        cache_k_rope.copy_(rows[:, nope: nope + cache_k_rope.shape[-1]].view(cache_k_rope.shape))


def track_states_torch(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                       num_layers, conv_strides, check_freed_slots) -> None:
    """Copy the conv and SSM state rows of every tracked request (mask set) from its slot to its track slot, in
    every layer: pools [slots, ...] for one layer (conv_strides[0] == 0) or [layers, slots, ...] for all."""
    if batch_size == 0:
        return
    keep = mamba_track_mask[:batch_size].bool()
    src = cache_indices[:batch_size][keep].long()
    dst = mamba_track_indices[:batch_size][keep].long()
    if check_freed_slots:
        live = (src >= 0) & (dst >= 0)
        src, dst = src[live], dst[live]
    if src.numel() == 0:
        return
    if num_layers == 1 and conv_strides[0] == 0:
        conv_states[dst] = conv_states[src]
        ssm_states[dst] = ssm_states[src]
    else:
        conv_states[:, dst] = conv_states[:, src]
        ssm_states[:, dst] = ssm_states[:, src]


# -- AROUND hooks (registered by the plugins; see installed_hooks) -----------------------------------------------------
def correct_attn_out_hook(original, out, lses, cp_rank, ctx, new_output=None, is_lse_base_on_e=False):
    """SGLang's ag_rs DCP merge step (scale this rank's partial by exp(lse_rank - LSE)) on CPU tensors in torch."""
    if out.device.type != "cpu":
        return original(out, lses, cp_rank, ctx, new_output, is_lse_base_on_e=is_lse_base_on_e)
    return correct_attn_out_torch(out, lses, cp_rank, new_output, is_lse_base_on_e)


def pack_a2a_send_hook(original, cp_attn_out, cp_attn_lse, dst_o, dst_lse):
    """SGLang's a2a DCP merge send-slot scatter of partial outputs and LSEs on CPU tensors in torch."""
    if cp_attn_out.device.type != "cpu":
        return original(cp_attn_out, cp_attn_lse, dst_o, dst_lse)
    return pack_a2a_send_torch(cp_attn_out, cp_attn_lse, dst_o, dst_lse)


def lse_combine_hook(original, recv_output, recv_lse, is_lse_base_on_e=True, return_lse=False):
    """SGLang's a2a DCP merge (LSE-weighted combine of the received partials) on CPU tensors in torch."""
    if recv_output.device.type != "cpu":
        return original(recv_output, recv_lse, is_lse_base_on_e=is_lse_base_on_e, return_lse=return_lse)
    return lse_combine_torch(recv_output, recv_lse, is_lse_base_on_e, return_lse)


def extend_metadata_hook(original, *args, **kwargs):
    """SGLang's DCP extend planner (indices of the all-gathered prefix buffer) for a CPU KV pool, in torch.

    The call's arguments are bound by SGLang's own signature (a reordered or renamed parameter is a TypeError here,
    never a silent mis-binding); `extend_gather_metadata_torch` takes the same names but the Triton helper's."""
    bound = dict(inspect.signature(original).bind(*args, **kwargs).arguments)
    if torch.device(bound["kv_cache_device"]).type != "cpu":
        return original(*args, **kwargs)
    bound.pop("create_chunked_prefix_cache_kv_indices_fn", None)
    return extend_gather_metadata_torch(**bound)


def track_states_hook(original, conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices,
                      batch_size, num_layers, conv_strides, ssm_strides, conv_numel, ssm_numel, check_freed_slots):
    """The extra_buffer KDA prefix cache's decode-time copy of states into track slots on CPU tensors in torch."""
    if conv_states.device.type != "cpu":
        return original(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices, batch_size,
                        num_layers, conv_strides, ssm_strides, conv_numel, ssm_numel, check_freed_slots)
    return track_states_torch(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices,
                              batch_size, num_layers, conv_strides, check_freed_slots)


def gather_into_tensor_hook(original, self, output, input):
    """GroupCoordinator all-gather of CPU tensors through its torch.distributed path (no CPU custom op registered)."""
    if input.device.type != "cpu":
        return original(self, output, input)
    self._all_gather_into_tensor(output, input)


def reduce_scatter_tensor_hook(original, self, output, input):
    """GroupCoordinator reduce-scatter of CPU tensors through its torch.distributed path (no CPU custom op)."""
    if input.device.type != "cpu":
        return original(self, output, input)
    self._reduce_scatter_tensor(output, input)


def all_to_all_single_hook(original, self, output, input):
    """GroupCoordinator all-to-all of CPU tensors through its torch.distributed path (no CPU custom op registered)."""
    if input.device.type != "cpu" or self.world_size == 1:
        return original(self, output, input)
    self._all_to_all_single(output, input)


_DCP_KERNELS = "sglang.kernels.ops.attention.dcp_kernels"
MERGE_HOOKS = [(f"{_DCP_KERNELS}.correct_attn_out", correct_attn_out_hook, "AROUND"),
               (f"{_DCP_KERNELS}.dcp_pack_a2a_send", pack_a2a_send_hook, "AROUND"),
               (f"{_DCP_KERNELS}.dcp_lse_combine_triton", lse_combine_hook, "AROUND")]
_GROUP = "sglang.srt.distributed.parallel_state.GroupCoordinator"
COLLECTIVE_HOOKS = [(f"{_GROUP}.all_gather_into_tensor", gather_into_tensor_hook, "AROUND"),
                    (f"{_GROUP}.reduce_scatter_tensor", reduce_scatter_tensor_hook, "AROUND"),
                    (f"{_GROUP}.all_to_all_single", all_to_all_single_hook, "AROUND")]
EXTEND_HOOKS = [("sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata", extend_metadata_hook,
                 "AROUND")]
TRACK_HOOKS = [("sglang.kernels.ops.mamba.mamba_state_scatter_triton._launch_track_mamba_states", track_states_hook,
                "AROUND")]
