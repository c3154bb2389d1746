"""Torch versions of SGLang's "direct" HiCache copies (sgl_kernel.kvcacheio), for a CPU host where the CUDA ops
cannot load.

SGLang's host pools in the `page_first_direct` layout keep, per buffer, [pages, layers, page_size, *row]; the
device pools keep one tensor per layer, [slots, *row]. Indices are token (slot) ids: host id h lives at
(h // page_size, layer, h % page_size). The three ops copy exactly those rows and nothing else (the CUDA kernels
copy whole pages of contiguous ids; token-wise copies of the same ids are the same bytes). All copies are
synchronous (a CPU host has one stream).
"""

from __future__ import annotations

from typing import Sequence

import torch


def _long(indices: torch.Tensor, device) -> torch.Tensor:
    return indices.reshape(-1).to(device=device, dtype=torch.long)


def transfer_kv_direct(src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    """Layer-first to layer-first: dst_layers[l][dst_indices] = src_layers[l][src_indices] for every layer l.
    Each layer tensor is [slots, *row]; indices [N]."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"transfer_kv_direct: {len(src_layers)} source layers, {len(dst_layers)} destination layers")
    for src, dst in zip(src_layers, dst_layers):
        dst.index_copy_(0, _long(dst_indices, dst.device), src.index_select(0, _long(src_indices, src.device)))


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int,
                                       page_size: int) -> None:
    """Host page-first to device layer-first, one layer: for each buffer pair,
    dst[dst_indices] = src[src_indices // page_size, layer_id, src_indices % page_size].
    src: [pages, layers, page_size, *row]; dst: [slots, *row]."""
    if len(src_ptrs) != len(dst_ptrs):
        raise ValueError("transfer_kv_per_layer_direct_pf_lf: one destination per source buffer")
    for src, dst in zip(src_ptrs, dst_ptrs):
        s = _long(src_indices, src.device)
        rows = src[s // page_size, layer_id, s % page_size]
        dst.index_copy_(0, _long(dst_indices, dst.device), rows.to(dst.device).reshape(-1, *dst.shape[1:]))


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    """Device layer-first to host page-first, all layers: the sources are the layers of every destination buffer in
    order (buffer j takes src_ptrs[j * L : (j + 1) * L], L = its layer count), and
    dst[dst_indices // page_size, l, dst_indices % page_size] = src_l[src_indices].
    src_l: [slots, *row]; dst: [pages, layers, page_size, *row]."""
    layers = [int(d.shape[1]) for d in dst_ptrs]
    if len(src_ptrs) != sum(layers):
        raise ValueError(f"transfer_kv_all_layer_direct_lf_pf: {len(src_ptrs)} source layers for destination "
                         f"buffers of {layers} layers")
    start = 0
    for dst, num_layers in zip(dst_ptrs, layers):
        d = _long(dst_indices, dst.device)
        page, offset = d // page_size, d % page_size
        for layer in range(num_layers):
            src = src_ptrs[start + layer]
            rows = src.index_select(0, _long(src_indices, src.device)).to(dst.device)
            dst[page, layer, offset] = rows.reshape(-1, *dst.shape[3:])
        start += num_layers


DIRECT_OPS = {op.__name__: op for op in (transfer_kv_direct, transfer_kv_per_layer_direct_pf_lf,
                                         transfer_kv_all_layer_direct_lf_pf)}
