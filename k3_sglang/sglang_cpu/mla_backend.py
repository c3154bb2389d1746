"""`k3_cpu_mla`: an MLA attention backend registered with SGLang's attention-backend registry.

SGLang's K3 (DeepseekV2AttentionMLA underneath) runs its absorbed MLA path with this backend: the handler
registered with `AttentionBackendRegistry` picks `AttnForwardMethod.MLA` for every mode, so each layer hands over
q [T, H_l, L] (L = kv_lora_rank + qk_rope_head_dim: the absorbed nope part and the rope part), k [T, 1, L] (this
step's latent cache rows [norm(c) | k_pe]) and v [T, 1, kv_lora_rank] (a view of k), and expects o [T, H_l *
kv_lora_rank] back, still in the latent (the model un-absorbs W_UV after).

The attention itself is k3_dcp_mla's pool attention (`k3_sglang/dcp_mla/pool_attention.py`): the rows are written to
SGLang's MLA pool, prefill chunks attend only each request's cached rows through the tiled extend kernel, decode is
one padded batched attention; under DCP the write is owner-filtered and the stripes are merged through their LSEs.
"""
from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from k3_sglang.dcp_mla.pool_attention import mla_attention
from k3_sglang.parallel.tp import Shard

from k3_sglang.sglang_cpu import MLA_BACKEND_NAME as BACKEND_NAME, add_backend_choice


def _dcp_shard() -> tuple[Shard, str]:
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    size = int(getattr(p, "attn_dcp_size", 1) or 1)
    if size <= 1:
        return Shard(), "ag_rs"
    backend = str(getattr(p, "dcp_comm_backend", None) or "ag_rs")
    return Shard(size, int(p.attn_dcp_rank)), ("a2a" if backend in ("a2a", "fi_a2a") else "ag_rs")


class K3CpuMLABackend(AttentionBackend):
    """Absorbed MLA over SGLang's MLA pool on CPU (TP, DCP)."""

    def __init__(self, model_runner) -> None:
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.forward_metadata = None
        self.dcp, self.dcp_merge = _dcp_shard()

    def init_forward_metadata(self, forward_batch) -> None:
        self.forward_metadata = None

    def _attend(self, q: torch.Tensor, k: torch.Tensor, layer, forward_batch, save_kv_cache: bool) -> torch.Tensor:
        """q [T, H_l * L] or [T, H_l, L]; k [T, 1, L] -> o [T, H_l * v_dim]."""
        if not save_kv_cache:
            raise NotImplementedError(f"{BACKEND_NAME}: save_kv_cache=False (the rows must reach the pool first)")
        t = q.shape[0]
        q_lat = q.reshape(t, layer.tp_q_head_num, layer.qk_head_dim)
        rows = k.reshape(t, layer.qk_head_dim)
        return mla_attention(layer, q_lat, rows, forward_batch, layer.v_head_dim, self.dcp, self.dcp_merge)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, layer, forward_batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, layer, forward_batch, save_kv_cache)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1


def create_backend(runner):
    """Factory registered under BACKEND_NAME in SGLang's ATTENTION_BACKENDS."""
    if not runner.use_mla_backend:
        raise ValueError(f"--attention-backend {BACKEND_NAME} serves MLA models only (K3's MLA layers)")
    return K3CpuMLABackend(runner)


def forward_method(attn, forward_batch):
    """Handler for SGLang's deepseek AttentionBackendRegistry: the absorbed MLA path in every mode."""
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    return AttnForwardMethod.MLA


def register() -> None:
    """Register the backend name, its factory and its forward-method handler with SGLang."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    add_backend_choice()
    ATTENTION_BACKENDS[BACKEND_NAME] = create_backend
    AttentionBackendRegistry.register(BACKEND_NAME, forward_method)
