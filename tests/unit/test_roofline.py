"""`k3 bench roofline` (pure): K3's MLA decode bytes and flops per rank, by hand at one row, and the committed
docs/roofline.md is what the code writes now."""
from __future__ import annotations

import dataclasses

import pytest

from k3_sglang.config_presets import k3_full
from k3_sglang.tooling.bench import roofline


def test_one_row_by_hand():
    cfg = k3_full()
    h200 = roofline.DEVICES[0]
    r = roofline.mla_decode_row(cfg, h200, dcp=8, context=128 * 1024)
    assert (r.heads, r.keys) == (96 // 16 * 8, 16384)
    assert r.kv_bytes == 24 * 16384 * 576 * 2
    assert r.qo_bytes == 24 * 48 * (576 + 512) * 2
    assert r.flops == 24 * 2 * 48 * 16384 * (576 + 512)
    # q_a + q_b + kv_a + kv_b + gate + o_proj, sharded over TP16, plus replicated norms (k3-architecture.md: 232.2 M
    # MLA attention parameters per layer)
    assert 232.0e6 * 2 / 16 * 24 < r.weight_bytes < 232.5e6 * 2 / 16 * 24 + 24 * 200_000
    assert roofline.step_us(r.kv_bytes, h200, 1.0) == pytest.approx(r.kv_bytes / 4.8e12 * 1e6)
    assert roofline.step_us(r.kv_bytes, h200, 0.7) == pytest.approx(r.kv_bytes / (0.7 * 4.8e12) * 1e6)


def test_dcp_divides_keys_and_multiplies_heads():
    cfg = k3_full()
    for d in roofline.DEVICES:
        for s in roofline.CONTEXTS:
            one = roofline.mla_decode_row(cfg, d, 1, s)
            for c in roofline.DCP_SIZES:
                r = roofline.mla_decode_row(cfg, d, c, s)
                assert r.keys == -(-s // c) and r.heads == one.heads * c
                assert r.flops == one.flops  # the group's work is the same, spread over c ranks' keys
                assert r.weight_bytes == one.weight_bytes


def test_rows_cover_the_grid_and_errors_are_clear():
    rows = roofline.rows()
    assert len(rows) == len(roofline.DEVICES) * len(roofline.CONTEXTS) * len(roofline.DCP_SIZES)
    odd = dataclasses.replace(roofline.DEVICES[0], attn_tp=5)
    with pytest.raises(ValueError, match="attention-TP 5"):
        roofline.mla_decode_row(k3_full(), odd, 1, 1024)


def test_committed_doc_is_current():
    assert roofline.DOC.read_text() == roofline.render(), "run `k3 bench roofline --write`"
