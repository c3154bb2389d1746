"""`Collective` over a torch.distributed process group (gloo on CPU, NCCL on CUDA).

In a server the group is SGLang's DCP group (`get_parallel().dcp_group.device_group`); in tests any gloo group.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class TorchGroup:
    """all_gather / reduce_scatter / all_to_all of contiguous tensors over `group` (see parallel/dcp.Collective)."""

    def __init__(self, group=None):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # gloo (and NCCL) take the flat concatenation [c * x.shape[0], ...]
        out = torch.empty((self.size * x.shape[0], *x.shape[1:]) if x.dim() else (self.size,), dtype=x.dtype,
                          device=x.device)
        dist.all_gather_into_tensor(out, x, group=self.group)
        return out.view(self.size, *x.shape)

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != self.size:
            raise ValueError(f"reduce_scatter: leading dim {x.shape[0]} != group size {self.size}")
        block = x.shape[1:]
        flat = x.contiguous().view(-1)  # [c * M]: rank j's block is flat[j M: (j + 1) M]
        out = torch.empty(flat.numel() // self.size, dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, flat, group=self.group)
        return out.view(block)

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != self.size:
            raise ValueError(f"all_to_all: leading dim {x.shape[0]} != group size {self.size}")
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=self.group)
        return out


def sglang_group(name: str) -> TorchGroup:
    """TorchGroup over one of SGLang's groups in this worker (e.g. "dcp_group", "attn_tp_group")."""
    from sglang.srt.runtime_context import get_parallel

    return TorchGroup(getattr(get_parallel(), name).device_group)
