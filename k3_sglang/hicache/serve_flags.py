"""What `k3 serve --enable-hierarchical-cache` adds and refuses on a CPU host (either K3 model on k3_cpu).

Defaults (each yields to the user's own flag or variable):
- the host tier sized from the memory free at start (hicache/host_sizing.py: a share, capped, printed), unless
  SGLang's `--hicache-size` or `--hicache-ratio` is given;
- `--hicache-io-backend direct --hicache-mem-layout page_first_direct`: the copy path our plugin supplies in torch
  (hicache/hooks.py); SGLang's `kernel` backend and other layouts need CUDA ops that a CPU host cannot load.
- Mooncake store (`--hicache-storage-backend mooncake`): TCP transport (`MOONCAKE_PROTOCOL=tcp`, no RDMA NIC),
  a 512 MiB segment per rank instead of SGLang's 4 GiB, and on a loopback `--host` the client's address and TCP
  listener on that address (`MOONCAKE_LOCAL_HOSTNAME`, `MC_TCP_BIND_ADDRESS`).

Refused before any server starts (exit 2, every reason listed), each because it is untested or cannot run here:
other IO backends and layouts; storage backends other than `file` and `mooncake`; write policies other than
`write_through`; `buffer_only` host mode; a file-backend directory the user named that is missing or unwritable; the radix cache off (`--disable-radix-cache`, or what `k3 serve` composes
for a speculative or PD server under DCP); Mooncake without a master address, or with a master that does not answer
(a TCP connect to it, so a backend that is down at start is a clear error, not a failed scheduler).
`cpu_hicache_refusals` reads SGLang's argument names (a parsed command line or a ServerArgs).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import tempfile

from k3_sglang.hicache.host_sizing import HostTier, host_tier
from k3_sglang.deployment import Deployment, coerce

CPU_HICACHE_DEFAULTS = {"--hicache-io-backend": "direct", "--hicache-mem-layout": "page_first_direct"}
# SGLang's own cache-mode default, given explicitly: without it SGLang sizes the host tier from free memory after a
# 10 GiB reserve and refuses to start on a 24 GB machine with less than that free.
CPU_HICACHE_RATIO = "2"
CPU_STORAGE_BACKENDS = ("file", "mooncake")
CPU_WRITE_POLICIES = ("write_through",)
CPU_MOONCAKE_ENV = {"MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_DEVICE": "", "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(512 << 20)}
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MASTER_CONNECT_TIMEOUT_S = 3.0




def hicache_requested(d: Deployment | list[str]) -> bool:
    """Whether this deployment turns SGLang's HiCache on."""
    return coerce(d).hicache


def cpu_host_tier(d: Deployment | list[str], mem_available: int | None) -> HostTier | None:
    """The host tier `k3 serve` sizes from free memory (hicache/host_sizing.py); None when HiCache is off or the
    user chose the size with SGLang's --hicache-size or --hicache-ratio."""
    d = coerce(d)
    if not d.hicache or d.sets("hicache_ratio") or d.sets("hicache_size"):
        return None
    return host_tier(mem_available, d.ranks)


def cpu_hicache_flags(d: Deployment | list[str], tier: HostTier | None = None) -> list[str]:
    """SGLang flags to append for HiCache on CPU (none when HiCache is off or the user set them). The host tier's
    size comes from `tier` (cpu_host_tier); without one, SGLang's --hicache-ratio 2 unless the user chose."""
    d = coerce(d)
    if not d.hicache:
        return []
    flags = [w for flag, value in CPU_HICACHE_DEFAULTS.items() if not d.sets_flag(flag) for w in (flag, value)]
    if not d.sets("hicache_ratio") and not d.sets("hicache_size"):
        flags += list(tier.flags) if tier is not None else ["--hicache-ratio", CPU_HICACHE_RATIO]
    return flags


def cpu_hicache_env(d: Deployment | list[str], host: str, env: dict[str, str]) -> dict[str, str]:
    """`env` with, where unset, the Mooncake-on-CPU variables with the mooncake backend. Unchanged otherwise."""
    d = coerce(d)
    if not d.hicache or d.hicache_storage_backend != "mooncake":
        return env
    out = dict(env)
    for name, value in CPU_MOONCAKE_ENV.items():
        out.setdefault(name, value)
    if host in LOOPBACK_HOSTS:
        address = "127.0.0.1" if host == "localhost" else host
        out.setdefault("MOONCAKE_LOCAL_HOSTNAME", address)
        out.setdefault("MC_TCP_BIND_ADDRESS", address)
    return out


def master_unreachable(address: str, timeout_s: float = MASTER_CONNECT_TIMEOUT_S) -> str:
    """'' when a TCP connection to `host:port` opens, else why not."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return f"MOONCAKE_MASTER={address!r} is not host:port"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return ""
    except OSError as exc:
        return f"the Mooncake master at {address} does not answer ({exc.strerror or exc})"


def named_file_storage_dir(args, environ) -> str | None:
    """The storage directory the user named for SGLang's file backend (SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, else
    the extra config's `file_storage_path`), or None."""
    extra = getattr(args, "hicache_storage_backend_extra_config", None) or {}
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            extra = {}
    return environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR") or (extra or {}).get("file_storage_path") or None


def file_storage_dir(args, environ) -> str:
    """The directory SGLang's file backend will use: the one the user named, else HiCacheFile's own default."""
    named = named_file_storage_dir(args, environ)
    if named:
        return named
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    return inspect.signature(HiCacheFile.__init__).parameters["file_path"].default


def file_storage_refusals(args, environ) -> list[str]:
    """A storage directory the user named that does not exist or that this process cannot write (SGLang would create
    a missing one silently, and fail on the first write to an unwritable one)."""
    directory = named_file_storage_dir(args, environ)
    if directory is None:  # SGLang's default, which it creates
        return []
    if not os.path.isdir(directory):
        return [f"--hicache-storage-backend file: the storage directory {directory} does not exist "
                "(SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR or file_storage_path; create it first)"]
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".k3-write-probe-"):
            pass
    except OSError as exc:
        return [f"--hicache-storage-backend file: the storage directory {directory} is not writable "
                f"({exc.strerror or exc})"]
    return []


def cpu_hicache_refusals(args, environ: dict[str, str] | None = None) -> list[str]:
    """Every reason SGLang's HiCache cannot run as asked on the CPU platform (empty when it can, or when off)."""
    if not getattr(args, "enable_hierarchical_cache", False):
        return []
    environ = os.environ if environ is None else environ
    reasons = []
    io_backend = getattr(args, "hicache_io_backend", "direct")
    if io_backend != "direct":
        reasons.append(f"--hicache-io-backend {io_backend}: on CPU the host tier copies through SGLang's `direct` "
                       "backend (its `kernel` ops are CUDA-only; `k3 serve` defaults to direct)")
    layout = getattr(args, "hicache_mem_layout", "page_first_direct")
    if layout != "page_first_direct":
        reasons.append(f"--hicache-mem-layout {layout}: on CPU the host tier runs the page_first_direct layout "
                       "(SGLang's KDA state host pool is page-first only; `k3 serve` defaults to page_first_direct)")
    policy = getattr(args, "hicache_write_policy", "write_through")
    if policy not in CPU_WRITE_POLICIES:
        reasons.append(f"--hicache-write-policy {policy}: not exercised on CPU "
                       f"(tested: {', '.join(CPU_WRITE_POLICIES)})")
    if getattr(args, "hicache_host_memory_mode", "cache") != "cache":
        reasons.append("--hicache-host-memory-mode buffer_only: not exercised on CPU")
    backend = getattr(args, "hicache_storage_backend", None)
    if backend is not None and backend not in CPU_STORAGE_BACKENDS:
        reasons.append(f"--hicache-storage-backend {backend}: not available on CPU "
                       f"(tested: {', '.join(CPU_STORAGE_BACKENDS)})")
    if backend == "mooncake":
        reasons += mooncake_refusals(environ) + mooncake_dcp_refusals(args)
    if backend == "file":
        reasons += file_storage_refusals(args, environ)
    return reasons + radix_refusals(args)


# SGLang releases whose MooncakeStore cannot start under DCP (docs/sglang-bugs.md, 3)
MOONCAKE_DCP_BROKEN = ("0.5.23",)


def mooncake_dcp_refusals(args, version: str | None = None) -> list[str]:
    """The Mooncake store under `--dcp-size > 1` on an SGLang whose `describe_l3_object_layout` probes with the
    physical host page (every scheduler dies on an assertion at start): refused with the reason instead."""
    dcp = int(getattr(args, "dcp_size", 1) or 1)
    if version is None:
        import sglang

        version = sglang.__version__
    if dcp <= 1 or version not in MOONCAKE_DCP_BROKEN:
        return []
    return [f"--hicache-storage-backend mooncake with --dcp-size {dcp}: SGLang {version}'s Mooncake store fails at "
            "start under DCP (its L3 layout probe uses the physical page; docs/sglang-bugs.md, 3); use the file "
            "backend under DCP"]


def radix_refusals(args) -> list[str]:
    """HiCache backs up the radix tree's pages, so it needs the radix cache; `k3 serve` turns that off for a
    speculative or PD server under DCP (serving/cli.py), and SGLang's HiCache under DCP has no DCP index translation
    for a draft model's host pool. Under DCP the KDA states follow `k3 serve`'s extra_buffer default (no_buffer with
    the radix cache under DCP is refused by the model's own limits)."""
    dcp = int(getattr(args, "dcp_size", 1) or 1)
    speculative = getattr(args, "speculative_algorithm", None)
    pd = (getattr(args, "disaggregation_mode", "null") or "null") != "null"
    if dcp > 1 and speculative:
        return [f"--enable-hierarchical-cache with --speculative-algorithm {speculative} under --dcp-size {dcp}: "
                "SGLang's HiCache under DCP translates only the target's MLA host pages (no draft host pool), and "
                "`k3 serve` runs speculative DCP without the radix cache; drop one of the three flags"]
    if dcp > 1 and pd:
        return [f"--enable-hierarchical-cache with --disaggregation-mode under --dcp-size {dcp}: `k3 serve` runs a "
                "PD server under DCP without the radix cache the host tier backs up (not exercised)"]
    if getattr(args, "disable_radix_cache", False):
        return ["--enable-hierarchical-cache with --disable-radix-cache: the host tier backs up the radix tree's "
                "pages (SGLang refuses the pair); drop --disable-radix-cache"]
    return []


def mooncake_refusals(environ) -> list[str]:
    """A Mooncake store backend needs a reachable master (MOONCAKE_MASTER) or a config file."""
    if environ.get("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH") or environ.get("MOONCAKE_CLIENT"):
        return []  # SGLang reads the master from the file or talks to a standalone client
    master = environ.get("MOONCAKE_MASTER", "")
    if not master:
        return ["--hicache-storage-backend mooncake: set MOONCAKE_MASTER=host:port of a running mooncake_master "
                "(or SGLANG_HICACHE_MOONCAKE_CONFIG_PATH)"]
    why = master_unreachable(master)
    return [f"--hicache-storage-backend mooncake: {why}; start it first (mooncake_master -rpc_port PORT)"] if why else []
