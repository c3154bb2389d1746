"""The k3_cpu platform's MLA KV pool: SGLang's `MLATokenToKVPool`, reading rows in torch when the pool is on CPU.

SGLang builds every MLA pool (standalone, and the full-attention leaf of SGLang's K3 hybrid KDA + MLA pool) from the
class the platform's public `SRTPlatform.get_kv_pool_cls(kind="mla")` returns (kv_cache_configurator
`_resolve_kv_pool_class`), constructed with the in-tree class's keyword arguments. The one method changed is
`get_mla_kv_buffer`, the pool read SGLang's DCP extend path (`layers/dcp/comm.py`) and MHA-prefix paths call: in-tree
it always launches the Triton kernel `get_mla_kv_buffer_triton`, which has no CPU driver; for a CPU pool the same
rows come from `dcp_mla.cpu_kernels.read_mla_rows_torch` (bit-exact against the kernel:
tests/model/test_dcp_cpu_kernels.py). Any other device keeps SGLang's method.
"""
from __future__ import annotations

from typing import Optional

import torch
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool


class K3CpuMLATokenToKVPool(MLATokenToKVPool):
    """SGLang's MLA pool; `get_mla_kv_buffer` reads CPU rows in torch."""

    def get_mla_kv_buffer(self, layer, loc: torch.Tensor, dst_dtype: Optional[torch.dtype] = None):
        """layer (its layer_id), loc [n] pool rows -> (cache_k_nope [n, 1, kv_lora_rank], cache_k_rope
        [n, 1, qk_rope_head_dim] or None when the pool has no rope part), in dst_dtype (default: the pool's)."""
        kv_buffer = self.get_key_buffer(layer.layer_id)
        if kv_buffer.device.type != "cpu":
            return super().get_mla_kv_buffer(layer, loc, dst_dtype)
        from k3_sglang.dcp_mla.cpu_kernels import read_mla_rows_torch

        dst_dtype = dst_dtype or self.dtype
        nope = torch.empty((loc.shape[0], 1, self.kv_lora_rank), dtype=dst_dtype, device=kv_buffer.device)
        rope = None if self.qk_rope_head_dim == 0 else torch.empty(
            (loc.shape[0], 1, self.qk_rope_head_dim), dtype=dst_dtype, device=kv_buffer.device)
        read_mla_rows_torch(kv_buffer, loc, nope, rope)
        return nope, rope
