"""L3 storage objects carry what wrote them in their key (hicache/storage_identity.py, the storage-name hook): a
restarted worker finds its own objects; objects written by another checkpoint, page size, DCP layout or SGLang
version are never loaded. Also: a file-backend directory that is missing or unwritable is refused (exit 2)."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest
import torch

from k3_sglang.hicache import hooks
from k3_sglang.hicache.serve_flags import cpu_hicache_refusals, file_storage_dir
from k3_sglang.hicache.storage_identity import (StorageIdentity, checkpoint_digest, identity_from_server_args,
                                                write_manifest)


def _checkpoint(tmp_path, name="ckpt", weights=b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}  "):
    root = tmp_path / name
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (root / "model.safetensors").write_bytes(weights)
    return root


def _args(model_path, **kw):
    base = dict(model_path=str(model_path), page_size=1, tp_size=1, pp_size=1, dcp_size=1, dtype="float32",
                kv_cache_dtype="auto", hicache_storage_backend="file", hicache_storage_backend_extra_config=None)
    return SimpleNamespace(**{**base, **kw})


def test_every_field_changes_the_key(tmp_path):
    base = identity_from_server_args(_args(_checkpoint(tmp_path)))
    assert base.digest() == identity_from_server_args(_args(tmp_path / "ckpt")).digest()  # stable
    variants = [dataclasses.replace(base, page_size=2), dataclasses.replace(base, dcp_size=2, tp_size=2),
                dataclasses.replace(base, sglang_version="0.5.24"), dataclasses.replace(base, checkpoint="other"),
                dataclasses.replace(base, dtype="bfloat16"), dataclasses.replace(base, k3_format=base.k3_format + 1)]
    names = {v.keyed_model_name("m") for v in variants} | {base.keyed_model_name("m")}
    assert len(names) == len(variants) + 1
    assert base.keyed_model_name("m").startswith("m-k3id") and base.keyed_model_name(None).startswith("k3id")


def test_a_checkpoint_rewritten_at_the_same_path_is_another_checkpoint(tmp_path):
    root = _checkpoint(tmp_path)
    before = checkpoint_digest(root)
    weights = root / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(weights.read_bytes())  # same bytes, rewritten: a new mtime
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10 ** 9))
    assert checkpoint_digest(root) != before
    config = root / "config.json"
    after_touch = checkpoint_digest(root)
    config.write_text(json.dumps({"hidden_size": 65}))
    assert checkpoint_digest(root) != after_touch
    assert checkpoint_digest("org/model") != checkpoint_digest("org/other")  # a hub id: by name


def _file_backend(directory, identity: StorageIdentity):
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=False,
                                  model_name=identity.keyed_model_name("k3-tiny"))
    return HiCacheFile(config, file_path=str(directory))


def test_sglang_file_backend_never_loads_another_identity_objects(tmp_path, monkeypatch):
    """SGLang's own HiCacheFile, keyed through our identity: a page written by identity A is found by a new
    backend (a restarted worker) with A, and by none of: another checkpoint, page size, DCP layout, SGLang version."""
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    store = tmp_path / "l3"
    store.mkdir()
    a = identity_from_server_args(_args(_checkpoint(tmp_path)))
    page = torch.randn(4, 16)
    assert _file_backend(store, a).set("prefixhash", page)
    restarted = _file_backend(store, a)
    out = torch.full_like(page, float("nan"))
    assert restarted.exists("prefixhash") and restarted.get("prefixhash", out) is not None
    assert torch.equal(out, page)
    for other in (dataclasses.replace(a, checkpoint=checkpoint_digest(_checkpoint(tmp_path, "b", b"x" * 20))),
                  dataclasses.replace(a, page_size=4), dataclasses.replace(a, dcp_size=2, tp_size=2),
                  dataclasses.replace(a, sglang_version="0.5.22")):
        backend = _file_backend(store, other)
        poisoned = torch.full_like(page, float("nan"))
        assert not backend.exists("prefixhash")
        assert backend.get("prefixhash", poisoned) is None and torch.isnan(poisoned).all()


def test_the_hook_keys_the_name_and_writes_a_manifest(tmp_path, monkeypatch):
    import sglang.srt.runtime_context as runtime_context

    store = tmp_path / "l3"
    args = _args(_checkpoint(tmp_path), hicache_storage_backend_extra_config=json.dumps({"file_storage_path": str(store)}))
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    monkeypatch.setattr(runtime_context, "get_server_args", lambda: args)
    monkeypatch.setattr(hooks, "_IDENTITY", None)
    name = hooks.storage_name_with_identity(lambda model_name, pool: f"{model_name}-fmt", "k3-tiny", object())
    identity = identity_from_server_args(args)
    assert name == f"k3-tiny-fmt-k3id{identity.digest()}"
    manifest = json.loads((store / f"k3-storage-{identity.digest()}.json").read_text())
    assert manifest["digest"] == identity.digest() and manifest["sglang_version"] == identity.sglang_version
    assert write_manifest(store, identity).name == f"k3-storage-{identity.digest()}.json"  # idempotent


def test_missing_or_unwritable_storage_dir_is_refused(tmp_path):
    args = SimpleNamespace(enable_hierarchical_cache=True, hicache_storage_backend="file",
                           hicache_storage_backend_extra_config=None)
    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path)}
    assert cpu_hicache_refusals(args, env) == []
    (missing,) = cpu_hicache_refusals(args, {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path / "nope")})
    assert "does not exist" in missing and str(tmp_path / "nope") in missing
    (unwritable,) = cpu_hicache_refusals(args, {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": "/proc"})
    assert "/proc is not writable" in unwritable
    extra = SimpleNamespace(**{**vars(args), "hicache_storage_backend_extra_config":
                               json.dumps({"file_storage_path": str(tmp_path / "gone")})})
    assert file_storage_dir(extra, {}) == str(tmp_path / "gone") and "does not exist" in cpu_hicache_refusals(extra, {})[0]
    assert cpu_hicache_refusals(SimpleNamespace(**{**vars(args), "hicache_storage_backend": None}),
                                {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": "/proc"}) == []


def test_k3_serve_exits_2_naming_the_storage_dir(tmp_path, monkeypatch, capsys):
    from k3_sglang.cli import main

    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(tmp_path / "nope"))
    assert main(["serve", "--dry-run", "--enable-hierarchical-cache", "--hicache-storage-backend", "file"]) == 2
    assert "the storage directory" in capsys.readouterr().err
