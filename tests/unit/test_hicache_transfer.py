"""HiCache host<->device copies on CPU (k3_sglang/hicache/transfer_ops.py): against a per-token reference, and
through SGLang's own host pools (MLA latent pages, KDA state slots) built for k3-tiny's shapes: a state that goes to
the host tier and comes back is bit-identical to the one saved, and a corrupted host copy is caught (sabotage).
About 10 s."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.hicache.hooks import CPU_HOST_RESERVE_BYTES, bind_direct_transfer_ops
from k3_sglang.hicache.transfer_ops import (transfer_kv_all_layer_direct_lf_pf, transfer_kv_direct,
                                            transfer_kv_per_layer_direct_pf_lf)


def _special(t: torch.Tensor) -> torch.Tensor:
    """Fill with random values plus NaN, inf and -0.0, so only a bitwise copy compares equal bit for bit."""
    t.copy_(torch.randn(t.shape, dtype=torch.float32).to(t.dtype))
    flat = t.view(-1)
    flat[:3] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=t.dtype)
    return t


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


@contextmanager
def cpu_host_reserve():
    """SGLang's host-pool allocation check with the CPU reserve our budget hook gives it in a server (1 GiB, not a GPU
    server's 10 GiB), so building a tiny host pool here does not depend on how much RAM other processes leave free."""
    from sglang.srt.mem_cache.pool_host import base

    saved = base.HICACHE_HOST_MEMORY_RESERVE_BYTES
    base.HICACHE_HOST_MEMORY_RESERVE_BYTES = CPU_HOST_RESERVE_BYTES
    try:
        yield
    finally:
        base.HICACHE_HOST_MEMORY_RESERVE_BYTES = saved


@pytest.mark.parametrize("page_size", [1, 4])
def test_direct_ops_match_a_per_token_reference(page_size):
    gen = torch.Generator().manual_seed(page_size)
    layers, slots, pages, row = 3, 40, 12, (1, 20)
    device = [_special(torch.empty(slots, *row)) for _ in range(layers)]
    host = torch.full((pages, layers, page_size, *row), 7.0)
    src = torch.randperm(slots, generator=gen)[:2 * page_size]
    dst = torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in (5, 2)])  # two whole host pages
    transfer_kv_all_layer_direct_lf_pf(device, [host], src, dst, page_size)
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        for layer in range(layers):
            assert _same_bits(host[d // page_size, layer, d % page_size], device[layer][s])
    untouched = [p for p in range(pages) if p not in (5, 2)]
    assert torch.all(host[untouched] == 7.0)
    back = torch.randperm(slots, generator=gen)[:dst.numel()]
    restored = [torch.zeros(slots, *row) for _ in range(layers)]
    for layer in range(layers):
        transfer_kv_per_layer_direct_pf_lf([host], [restored[layer]], dst, back, layer, page_size)
        assert _same_bits(restored[layer][back], device[layer][src])
    copies = [torch.zeros(slots, *row) for _ in range(layers)]
    transfer_kv_direct(device, copies, src, back, page_size)
    assert all(_same_bits(c[back], d[src]) for c, d in zip(copies, device))


def test_all_layer_backup_splits_sources_over_destination_buffers():
    k_layers = [_special(torch.empty(8, 2, 4)) for _ in range(2)]
    v_layers = [_special(torch.empty(8, 2, 4)) for _ in range(2)]
    k_host, v_host = torch.zeros(4, 2, 1, 2, 4), torch.zeros(4, 2, 1, 2, 4)
    idx = torch.tensor([3, 1])
    transfer_kv_all_layer_direct_lf_pf(k_layers + v_layers, [k_host, v_host], idx, torch.tensor([0, 2]), 1)
    assert _same_bits(k_host[2, 1, 0], k_layers[1][1]) and _same_bits(v_host[0, 0, 0], v_layers[0][3])
    with pytest.raises(ValueError, match="source layers"):
        transfer_kv_all_layer_direct_lf_pf(k_layers, [k_host, v_host], idx, idx, 1)


@pytest.fixture(scope="module")
def tiny_pools():
    """SGLang's device and host pools with k3-tiny's per-rank shapes (3 MLA layers of 64 + 16; 6 KDA layers of
    4 heads x 32 x 32 fp32 state and a [3, 384] bf16 conv window), host pools pageable as our hook builds them."""
    from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    bind_direct_transfer_ops()
    cfg = preset("k3-tiny")
    mla = MLATokenToKVPool(size=96, page_size=1, dtype=torch.float32, kv_lora_rank=cfg.mla.kv_lora_rank,
                           qk_rope_head_dim=cfg.mla.qk_rope_head_dim, layer_num=len(cfg.mla.layer_ids), device="cpu",
                           enable_memory_saver=False)
    with cpu_host_reserve():
        mla_host = MLATokenToKVPoolHost(mla.get_device_pool_infos()[0].buffer_info, 2.0, 0, 1, "page_first_direct",
                                        pin_memory=False, device_capacity_tokens=96, start_layer=0,
                                        end_layer=len(cfg.mla.layer_ids) - 1, target_layer_num=len(cfg.mla.layer_ids))
    shape = KimiLinearStateShape.create(tp_world_size=1, num_heads=cfg.kda.num_heads, head_dim=cfg.kda.head_dim,
                                        conv_kernel_size=cfg.kda.conv_kernel_size)
    layers = list(cfg.kda.layer_ids)
    kda = MambaPool(size=24, spec_state_size=0, cache_params=KimiLinearCacheParams(shape=shape, layers=layers),
                    mamba_layer_ids=layers, device="cpu")
    (info,) = kda.get_device_pool_infos()
    with cpu_host_reserve():
        kda_host = MambaPoolHost(info.buffer_info, 2.0, 0, device_capacity=24, layout="page_first_direct",
                                 pin_memory=False)
    return mla, mla_host, kda, info.buffer_info, kda_host


def _kda_round_trip(kda, state, kda_host, sabotage: bool) -> bool:
    """Save slots 3, 9, 17 to the host tier, clobber the device, restore into slots 5, 6, 7; True when every
    restored conv window and recurrent state is bit-identical to its saved one."""
    for t in (state.temporal, *state.conv):
        _special(t)
    src, dst = torch.tensor([3, 9, 17]), torch.tensor([5, 6, 7])
    host = kda_host.alloc(3)
    kda_host.backup_from_device_all_layer(kda, host, src, io_backend="direct")
    saved = [t[:, src].clone() for t in (state.temporal, *state.conv)]
    if sabotage:
        kda_host.temporal_buffer.view(-1)[kda_host.temporal_buffer[0].numel() * int(host[1])] += 1.0
    for t in (state.temporal, *state.conv):
        t.fill_(0.5)
    for layer in range(state.temporal.shape[0]):
        kda_host.load_to_device_per_layer(kda, host, dst, layer, io_backend="direct")
    kda_host.free(host)
    return all(_same_bits(t[:, dst], s) for t, s in zip((state.temporal, *state.conv), saved))


def test_kda_states_restored_from_host_are_bit_identical(tiny_pools):
    _, _, kda, state, kda_host = tiny_pools
    assert state.temporal.dtype == torch.float32 and state.temporal.shape[0] == 6
    assert _kda_round_trip(kda, state, kda_host, sabotage=False)


def test_sabotage_a_corrupted_host_state_is_caught(tiny_pools):
    _, _, kda, state, kda_host = tiny_pools
    assert not _kda_round_trip(kda, state, kda_host, sabotage=True)


def test_mla_latent_rows_restored_from_host_are_bit_identical(tiny_pools):
    mla, mla_host, *_ = tiny_pools
    for layer in mla.kv_buffer:
        _special(layer)
    src, dst = torch.tensor([1, 2, 40, 77, 95]), torch.tensor([10, 11, 12, 13, 14])
    host = mla_host.alloc(5)
    mla_host.backup_from_device_all_layer(mla, host, src, "direct")
    saved = [layer[src].clone() for layer in mla.kv_buffer]
    for layer in mla.kv_buffer:
        layer.zero_()
    for layer_id in range(len(mla.kv_buffer)):
        mla_host.load_to_device_per_layer(mla, host, dst, layer_id, "direct")
    assert all(_same_bits(layer[dst], s) for layer, s in zip(mla.kv_buffer, saved))
    # The L3 page format: a host page read out and written back (what a storage get does) is the same bytes.
    page = mla_host.get_data_page(int(host[2])).clone()
    mla_host.set_from_flat_data_page(int(host[3]), page)
    assert _same_bits(mla_host.get_data_page(int(host[3])), page)
    assert mla_host.get_dummy_flat_data_page().numel() == page.numel()  # pageable: no NVIDIA driver needed
