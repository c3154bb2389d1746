"""Every SGLang target we hook or reach into, fingerprinted (signature, source hash) against the committed snapshot
k3_sglang/sglang_fingerprints.json: the installed SGLang matches it, a changed target is named with the inventory rows
to re-read (`k3 hooks check`, exit 1), and the DCP extend planner's arguments are bound by SGLang's parameter names."""
from __future__ import annotations

import json

import pytest

from k3_sglang import sglang_fingerprints as fp

PLANNER = "sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata"


@pytest.fixture(scope="module")
def now():
    return fp.current()


def test_the_installed_sglang_matches_the_snapshot(now):
    snapshot = fp.load_snapshot()
    assert set(snapshot["targets"]) == set(fp.watched_targets())  # every watched target is in the snapshot
    assert [t for t, f in now.items() if "missing" in f] == []
    assert fp.differences(snapshot, now) == [], "an SGLang target changed: re-read the rows `k3 hooks check` " \
        "names, then `k3 hooks snapshot`"
    assert sum(1 for f in now.values() if f.get("source_sha256")) >= 60


def test_a_changed_signature_and_a_changed_source_are_named_with_their_rows(now, monkeypatch):
    from sglang.srt.layers.dcp import planner

    def reordered(extend_prefix_lens, seq_lens, *rest):  # a parameter order SGLang might move to
        return None

    monkeypatch.setattr(planner, "prepare_decode_context_parallel_metadata", reordered)
    snapshot = fp.load_snapshot()
    changed = fp.current()
    lines = fp.differences(snapshot, changed, fp.watched_targets())
    assert len(lines) == 1 and lines[0].startswith(f"{PLANNER}: signature (seq_lens: torch.Tensor, ")
    assert "-> (extend_prefix_lens, seq_lens, *rest)" in lines[0]
    assert "re-read: AROUND " + PLANNER + " (k3_sglang.sglang_cpu.hooks)" in lines[0]
    assert "re-read: SIGNATURE_BIND " + PLANNER in lines[0]
    edited = json.loads(json.dumps(snapshot))
    edited["targets"]["sglang.srt.layers.attn_residual._mix_fused"]["source_sha256"] = "0" * 64
    lines = fp.differences(edited, now, fp.watched_targets())
    assert lines == [f"sglang.srt.layers.attn_residual._mix_fused: source_sha256 changed"
                     + "".join(f"\n    re-read: {r}" for r in fp.watched_targets()
                               ["sglang.srt.layers.attn_residual._mix_fused"])]


def test_k3_hooks_check_exits_1_naming_a_changed_target(tmp_path, capsys):
    from k3_sglang.cli import main

    assert main(["hooks", "check"]) == 0
    assert capsys.readouterr().out.strip().endswith("no target changed")
    snapshot = fp.load_snapshot()
    del snapshot["targets"][PLANNER]
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot))
    assert main(["hooks", "check", "--snapshot", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"CHANGED {PLANNER}: new target, not in the snapshot" in out and "1 target(s) changed" in out


def test_the_extend_planner_arguments_are_bound_by_sglangs_names(monkeypatch):
    import torch

    from k3_sglang.dcp_mla import cpu_kernels

    seen = {}
    monkeypatch.setattr(cpu_kernels, "extend_gather_metadata_torch", lambda **kw: seen.update(kw) or "torch")

    def reordered(extend_seq_lens, seq_lens, extend_prefix_lens, extend_prefix_lens_cpu, req_pool_indices,
                  req_to_token, seq_lens_sum, kv_buffer_shape, kv_cache_dtype, kv_cache_device,
                  create_chunked_prefix_cache_kv_indices_fn):  # SGLang moved extend_seq_lens first
        return "sglang"

    args = ["esl", "sl", "epl", "eplc", "rpi", "r2t", 7, (1, 2), torch.float32]
    assert cpu_kernels.extend_metadata_hook(reordered, *args, kv_cache_device="cpu",
                                            create_chunked_prefix_cache_kv_indices_fn=None) == "torch"
    assert seen == {"extend_seq_lens": "esl", "seq_lens": "sl", "extend_prefix_lens": "epl",
                    "extend_prefix_lens_cpu": "eplc", "req_pool_indices": "rpi", "req_to_token": "r2t",
                    "seq_lens_sum": 7, "kv_buffer_shape": (1, 2), "kv_cache_dtype": torch.float32,
                    "kv_cache_device": "cpu"}

    def renamed(seq_lens, prefix_lens, *rest):
        return "sglang"

    with pytest.raises(TypeError):  # a parameter SGLang renamed: loud, never a silent mis-binding
        cpu_kernels.extend_metadata_hook(renamed, "sl", extend_prefix_lens="epl")
