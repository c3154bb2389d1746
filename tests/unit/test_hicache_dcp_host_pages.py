"""HiCache under DCP2 on CPU, below the server: SGLang's own MLA host pool built per DCP rank (`dcp_size=2`,
`dcp_rank=r`, the widened page the DCP allocator hands it, as `hybrid_pool_assembler` builds it) over that rank's
device pool, with our torch copy ops (k3_sglang/hicache/transfer_ops.py).

DCP's layout: logical (widened) slot s lives on rank s % 2 at physical row s // 2, on the device and in the host
tier. A session's latent rows go to each rank's host pool and come back bit-identical (values include NaN, inf and
-0.0), each rank's host rows hold only its own stripe, and a restore from the other rank's host rows is caught (the
sabotage control). About 5 s (most of it importing SGLang)."""
from __future__ import annotations

import pytest
import torch

from k3_sglang.config import preset
from k3_sglang.hicache.hooks import bind_direct_transfer_ops
from tests.unit.test_hicache_transfer import _same_bits, _special, cpu_host_reserve

DCP = 2
ROWS = 48  # physical device rows per rank: 96 logical slots


@pytest.fixture(scope="module")
def rank_pools():
    """[(device MLA pool, host MLA pool)] per DCP rank, k3-tiny's per-rank latent shapes (3 layers of 64 + 16)."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    bind_direct_transfer_ops()
    cfg = preset("k3-tiny")
    layers = len(cfg.mla.layer_ids)
    pools = []
    for rank in range(DCP):
        device = MLATokenToKVPool(size=ROWS, page_size=1, dtype=torch.float32, kv_lora_rank=cfg.mla.kv_lora_rank,
                                  qk_rope_head_dim=cfg.mla.qk_rope_head_dim, layer_num=layers, device="cpu",
                                  enable_memory_saver=False)
        with cpu_host_reserve():
            host = MLATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info, 2.0, 0, DCP,
                                        "page_first_direct", pin_memory=False, dcp_size=DCP, dcp_rank=rank,
                                        device_capacity_tokens=ROWS, start_layer=0, end_layer=layers - 1,
                                        target_layer_num=layers)
        pools.append((device, host))
    return pools


def _logical(pools, slots: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the latent rows of logical slots `slots` gathered from their owner ranks: [len(slots), 1, 80]."""
    out = []
    for layer in range(len(pools[0][0].kv_buffer)):
        rows = [pools[int(s) % DCP][0].kv_buffer[layer][int(s) // DCP] for s in slots]
        out.append(torch.stack(rows))
    return out


def _save_and_restore(pools, src: torch.Tensor, dst: torch.Tensor, swap_ranks: bool = False):
    """Back up logical slots `src` into every rank's host pool (the same host slots on each rank, as SGLang's
    controller allocates in lockstep), clobber the devices, load them back into logical slots `dst` (with
    swap_ranks, from the other rank's host rows).
    Returns (saved rows, host slots)."""
    for device, _ in pools:
        for layer in device.kv_buffer:
            _special(layer)
    saved = _logical(pools, src)
    hosts = [host.alloc(src.numel()) for _, host in pools]
    assert all(torch.equal(h, hosts[0]) for h in hosts)
    for (device, host), slots in zip(pools, hosts):
        host.backup_from_device_all_layer(device, slots, src, "direct")
    for device, _ in pools:
        for layer in device.kv_buffer:
            layer.fill_(0.25)
    if swap_ranks:  # each rank's host rows replaced by the other rank's (a page stored under the wrong DCP rank)
        a, b = (host.kv_buffer for _, host in pools)
        saved_a = a.clone()
        a.copy_(b)
        b.copy_(saved_a)
    for (device, host), slots in zip(pools, hosts):
        for layer_id in range(len(device.kv_buffer)):
            host.load_to_device_per_layer(device, slots, dst, layer_id, "direct")
    return saved, hosts[0]


def test_each_rank_restores_its_own_stripe_bit_identical(rank_pools):
    src = torch.cat([torch.arange(6, 10), torch.arange(40, 46), torch.arange(90, 92)])  # whole widened pages
    dst = torch.arange(20, 32)
    saved, host_slots = _save_and_restore(rank_pools, src, dst)
    assert all(_same_bits(r, s) for r, s in zip(_logical(rank_pools, dst), saved))
    # Each rank's host tier holds its own stripe only. SGLang's L3 page of a widened host page starting at logical
    # slot p is, on rank r, its one physical row: logical host slot p + r, i.e. the saved row of src[i] there.
    position = {h: i for i, h in enumerate(host_slots.tolist())}
    for start in host_slots[::DCP].tolist():
        for rank, (_, host) in enumerate(rank_pools):
            i = position[start + rank]
            assert int(src[i]) % DCP == rank  # page-aligned runs keep the owner rule from device to host
            expected = torch.cat([layer[i].reshape(-1) for layer in saved])
            assert _same_bits(host.get_data_page(start), expected), (start, rank)
    # The L3 page format per rank: a page read out and written back (what a storage get does) is the same bytes.
    _, host = rank_pools[1]
    page = host.get_data_page(int(host_slots[0])).clone()
    host.set_from_flat_data_page(int(host_slots[2]), page)
    assert _same_bits(host.get_data_page(int(host_slots[2])), page)
    for _, host in rank_pools:
        host.free(host_slots)


def test_sabotage_a_restore_from_the_other_ranks_host_rows_is_caught(rank_pools):
    src, dst = torch.arange(10, 18), torch.arange(60, 68)
    saved, host_slots = _save_and_restore(rank_pools, src, dst, swap_ranks=True)
    assert not any(_same_bits(r, s) for r, s in zip(_logical(rank_pools, dst), saved))
    for _, host in rank_pools:
        host.free(host_slots)
