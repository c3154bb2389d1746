"""The `k3_dcp_mla` attention backend SGLang's K3 (DeepseekV2AttentionMLA underneath) calls, on CUDA (Triton) and on
the k3_cpu platform (torch).

SGLang's absorbed-MLA forward (`forward_mla.py`) hands a backend listed in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
q = q_nope_out [T, H * kv_lora_rank], k = k_nope [T, 1, kv_lora_rank], q_rope [T, H, rope], k_rope [T, 1, rope]:
- decode under DCP (`attn_mqa_for_dcp_decode`, H = c x this rank's heads, queries all-gathered): the rows are
  written (owner-filtered) and each rank attends its stripe; the backend returns (o [T, H * kv_lora_rank], lse) for
  SGLang's merge (`cp_lse_ag_out_rs_mla` / `dcp_a2a_lse_reduce`), the LSE in the base that merge reads for this
  backend's name (`is_mla_dcp_lse_base_on_e`: base 2 today, converted from the kernel's natural log);
- target verify under DCP: the same, several queries per request with their global causal bounds;
- extend (prefill chunks): SGLang all-gathers the prefix and the chunk into `attn_dcp_metadata.dcp_kv_buffer`
  under DCP; the chunk attends that buffer densely with this rank's own heads (no merge), or the pool without DCP.
The kernel contract is cutedsl_mla's `_run_decode_kernel` (rank-local output and natural-log LSE).
"""
from __future__ import annotations

import math
import os

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from k3_sglang.dcp_mla import BACKEND_NAME, add_backend_choice
from k3_sglang.dcp_mla.metadata import StripeBatch, stripe_batch
from k3_sglang.kernels import dispatch
from k3_sglang.dcp_mla.kv_read_trace import ENV as TRACE_ENV, KVReadTrace

LOG2_E = 1.0 / math.log(2.0)


def _dcp_rank() -> tuple[int, int]:
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    size = int(getattr(p, "attn_dcp_size", 1) or 1)
    return (size, int(p.attn_dcp_rank)) if size > 1 else (1, 0)


def _tp_rank() -> int:
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().tp_rank)


def merge_lse_base_e() -> bool:
    """Whether SGLang's DCP merge reads this backend's LSE as natural log (it names base-e backends)."""
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla import is_mla_dcp_lse_base_on_e

    return bool(is_mla_dcp_lse_base_on_e(BACKEND_NAME))


class K3DcpMLABackend(AttentionBackend):
    """Absorbed MLA over SGLang's MLA pool with decode context parallelism (any page size, no CUDA graphs)."""

    def __init__(self, model_runner) -> None:
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.kv_index_translator = model_runner.kv_index_translator  # SGLang's DCP extend planner reads it
        self.page_size = int(model_runner.page_size)
        self.cp_world, self.cp_rank = _dcp_rank()
        if getattr(self.kv_index_translator, "is_translating", False):
            raise NotImplementedError(f"{BACKEND_NAME}: translated (unified / fused-draft) KV pools are not supported")
        self.lse_base_e = merge_lse_base_e()
        self.batch: StripeBatch | None = None
        # rows handed to the kernel per call, for `k3 bench dcp` (off, no I/O, unless K3_KV_READ_TRACE is set)
        self.trace = KVReadTrace.from_env(_tp_rank()) if os.environ.get(TRACE_ENV) else KVReadTrace(None, 0)

    def init_forward_metadata(self, forward_batch) -> None:
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.batch = None
            return
        if not (mode.is_decode() or mode.is_target_verify() or mode.is_extend()):
            raise NotImplementedError(f"{BACKEND_NAME}: forward mode {mode} is not supported")
        self.batch = stripe_batch(forward_batch, self.req_to_token, self.page_size, self.cp_world, self.cp_rank)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError(f"{BACKEND_NAME} runs eagerly: start the server with --cuda-graph-backend-decode "
                                  "disabled (k3 serve and k3 launch render do)")

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    # -- the kernel contract ----------------------------------------------------------------------------------------
    def _run_decode_kernel(self, query, kv_cache, block_tables, seq_lens, max_seq_len, layer, *, causal_seqs=None,
                           cp_world: int = 1, cp_rank: int = 0, return_lse: bool = False):
        """cutedsl_mla's contract: query [B, q_len, H, L] (or [B, H, L]), kv_cache paged [pages, (1,) P, L] (or rows
        [N, L] with P = 1), block_tables [B, M] physical pages, seq_lens [B] this rank's key counts, causal_seqs [B]
        global KV lengths (the last query's position + 1; required under DCP, seq_lens otherwise). Returns
        (o [B, q_len, H, v_dim], lse [B, q_len, H] natural log, rank-local) with return_lse, else o. max_seq_len is
        not needed."""
        if cp_world > 1 and causal_seqs is None:
            raise ValueError(f"{BACKEND_NAME}: causal_seqs (global per-request KV lengths) is required under DCP")
        q = query if query.dim() == 4 else query.unsqueeze(1)
        b, q_len, h, width = q.shape
        page = kv_cache.shape[-2] if kv_cache.dim() >= 3 else 1
        rows = kv_cache.reshape(-1, width)
        q_indptr = torch.arange(0, (b + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
        causal = seq_lens if causal_seqs is None else causal_seqs
        o, lse = dispatch.mla_dcp(q.reshape(b * q_len, h, width).to(rows.dtype), rows, block_tables, q_indptr,
                                  seq_lens, causal, page, cp_world, cp_rank, layer.v_head_dim, layer.scaling,
                                  q_len=q_len)
        o, lse = o.view(b, q_len, h, -1), lse.view(b, q_len, h)
        return (o, lse) if return_lse else o

    def _attend(self, query: torch.Tensor, layer, forward_batch) -> tuple[torch.Tensor, torch.Tensor]:
        """query [T, H, L] -> (o [T, H, v_dim], lse [T, H] natural log) over this forward's keys."""
        b = self.batch
        if b.gathered:
            cache = forward_batch.attn_dcp_metadata.dcp_kv_buffer
        else:
            cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        rows = cache.reshape(-1, query.shape[-1])
        if b.q_len is not None and not b.gathered:
            n, pages = b.block_table.shape[0], rows.shape[0] // b.page_size
            paged = rows[: pages * b.page_size].view(pages, b.page_size, rows.shape[-1])
            o, lse = self._run_decode_kernel(query.view(n, b.q_len, *query.shape[1:]), paged, b.block_table,
                                             b.kv_lens, None, layer, causal_seqs=b.causal_seqs, cp_world=b.cp_world,
                                             cp_rank=b.cp_rank, return_lse=True)
            return o.reshape(query.shape[0], query.shape[1], -1), lse.reshape(query.shape[0], -1)
        return dispatch.mla_dcp(query.to(rows.dtype), rows, b.block_table, b.q_indptr, b.kv_lens, b.causal_seqs,
                                b.page_size, b.cp_world, b.cp_rank, layer.v_head_dim, layer.scaling, q_len=b.q_len)

    # -- SGLang's forward entry points ------------------------------------------------------------------------------
    def _forward(self, q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope):
        if self.batch is None:
            raise RuntimeError(f"{BACKEND_NAME}: attention called without forward metadata")
        width = layer.head_dim
        if save_kv_cache:
            self._save(layer, forward_batch, k, k_rope)
        if q_rope is not None:
            query = torch.cat([q.view(-1, layer.tp_q_head_num, layer.v_head_dim),
                               q_rope.view(-1, layer.tp_q_head_num, width - layer.v_head_dim)], dim=-1)
        else:
            query = q.view(-1, layer.tp_q_head_num, width)
        mode = forward_batch.forward_mode
        if self.trace.enabled:
            self.trace.record("decode" if mode.is_decode() else "extend", int(self.batch.kv_lens.sum()))
        o, lse = self._attend(query, layer, forward_batch)
        o = o.to(q.dtype).reshape(o.shape[0], -1)
        if self.cp_world > 1 and (mode.is_decode() or mode.is_target_verify()):
            return o, (lse if self.lse_base_e else lse * LOG2_E)  # rank-local: SGLang's forward_mla merges
        return o

    def _save(self, layer, forward_batch, k, k_rope) -> None:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        if k_rope is None:  # k holds whole latent rows [T, 1, L]
            k, k_rope = k[..., : layer.v_head_dim], k[..., layer.v_head_dim:]
        self.token_to_kv_pool.set_mla_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, k_rope)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kwargs):
        return self._forward(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kwargs):
        return self._forward(q, k, layer, forward_batch, save_kv_cache, q_rope, k_rope)


def create_backend(runner):
    """Factory registered under BACKEND_NAME in SGLang's ATTENTION_BACKENDS."""
    if not runner.use_mla_backend:
        raise ValueError(f"--attention-backend {BACKEND_NAME} serves MLA models only (K3's MLA layers)")
    return K3DcpMLABackend(runner)


def forward_method(attn, forward_batch):
    """Handler for SGLang's deepseek AttentionBackendRegistry: the absorbed MLA path in every mode."""
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    return AttnForwardMethod.MLA


def register() -> None:
    """The backend name, its factory, its forward-method handler, and its place among the backends SGLang's
    absorbed MLA hands (q_nope, q_rope, k_nope, k_rope) and asks for the DCP LSE."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_common import utils
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    add_backend_choice()
    ATTENTION_BACKENDS[BACKEND_NAME] = create_backend
    AttentionBackendRegistry.register(BACKEND_NAME, forward_method)
    if BACKEND_NAME not in utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
        utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.append(BACKEND_NAME)
