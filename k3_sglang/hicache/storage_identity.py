"""What a HiCache storage object (L3: the file backend, Mooncake store) was written by, in its key (issue 42).

SGLang 0.5.23 keys L3 objects by a hash of the token prefix and the served model *name* plus the rank layout
(`HiCacheFile.config_suffix`, Mooncake's key prefix). A checkpoint rewritten at the same path, another page size, a
DCP layout it does not name, or another SGLang version reading the same storage would load states written for
something else: wrong latent rows or KDA states, silently. Our plugin (hicache/hooks.py) therefore appends one digest
to the model name SGLang keys storage with (`cache_controller.storage_model_name`, an AROUND hook):

    digest = sha256({checkpoint, page size, TP / PP / DCP sizes, dtype, KV dtype, SGLang version, K3_FORMAT})[:16]

so an object written under any other identity has another key and is never looked up (no manifest to trust or
race on). `checkpoint` is a digest of config.json and, per weight file, its name, size, mtime and safetensors
header (shapes and dtypes): a rewrite changes it without reading terabytes of weights. A manifest
(`k3-storage-<digest>.json`, the identity in plain words) is written beside file-backend objects for people.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

K3_FORMAT = 1  # bump when k3-sglang changes what its KDA or latent pages mean
KEY_TAG = "k3id"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class StorageIdentity:
    """Everything that must match for a stored page or state to be loadable."""

    checkpoint: str
    page_size: int
    tp_size: int
    pp_size: int
    dcp_size: int
    dtype: str
    kv_cache_dtype: str
    sglang_version: str
    k3_format: int = K3_FORMAT

    def digest(self) -> str:
        """16 hex digits naming this identity."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def keyed_model_name(self, model_name: str | None) -> str:
        """The model name SGLang's storage backends key on, with this identity appended."""
        tag = f"{KEY_TAG}{self.digest()}"
        return f"{model_name}-{tag}" if model_name else tag

    def manifest(self) -> dict:
        return {"digest": self.digest(), **asdict(self)}


def _safetensors_header(path: Path) -> bytes:
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return b""
        (length,) = struct.unpack("<Q", head)
        return f.read(min(length, 64 << 20))


def checkpoint_digest(model_path: str | os.PathLike) -> str:
    """Digest of a checkpoint directory: config.json's bytes and each weight file's name, size, mtime and (for
    safetensors) header. A path that is not a local directory (a hub id) is digested by its name."""
    root = Path(model_path)
    h = hashlib.sha256()
    if not root.is_dir():
        h.update(f"name:{model_path}".encode())
        return h.hexdigest()[:16]
    config = root / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"no-config")
    for path in sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)):
        stat = path.stat()
        h.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        if path.name.endswith(".safetensors"):
            h.update(_safetensors_header(path))
    return h.hexdigest()[:16]


def identity_from_server_args(args) -> StorageIdentity:
    """The identity of a server from its ServerArgs (or any object with SGLang's argument names)."""
    from importlib.metadata import version

    return StorageIdentity(
        checkpoint=checkpoint_digest(args.model_path),
        page_size=int(getattr(args, "page_size", 1) or 1),
        tp_size=int(getattr(args, "tp_size", 1) or 1),
        pp_size=int(getattr(args, "pp_size", 1) or 1),
        dcp_size=int(getattr(args, "dcp_size", 1) or 1),
        dtype=str(getattr(args, "dtype", "auto")),
        kv_cache_dtype=str(getattr(args, "kv_cache_dtype", "auto")),
        sglang_version=version("sglang"),
    )


def write_manifest(directory: str | os.PathLike, identity: StorageIdentity) -> Path:
    """`k3-storage-<digest>.json` in the file backend's directory (for people; keys carry the digest)."""
    path = Path(directory) / f"k3-storage-{identity.digest()}.json"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(identity.manifest(), indent=1, sort_keys=True))
        os.replace(tmp, path)
    return path
