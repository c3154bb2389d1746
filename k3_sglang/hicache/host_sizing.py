"""The HiCache host tier `k3 serve --enable-hierarchical-cache` sizes from the host's memory (issue 42).

SGLang's cache-mode default is a host tier of 2 x the device pools (`--hicache-ratio 2`). Agent sessions pause
between turns, so on the embedded default a tier of twice a 16K-token device pool held fewer tokens than the paused
sessions (8 x ~6K tokens), and LRU over a round-robin working set larger than the tier hit nothing, while 20 GB of
RAM sat free and the tiny model's sessions need a few MB each. So, when the user passes neither `--hicache-size` nor
`--hicache-ratio` (SGLang's own flags, which always win), the tier is

    --hicache-size = min(CAP_GB, floor(SHARE x MemAvailable / ranks on this host))     GB per rank

a stated share of what is free at start, capped; below 1 GB per rank (SGLang's flag counts whole GB) it falls back to
SGLang's `--hicache-ratio 2`. SGLang's host buffers are mapped without prefaulting (hicache/hooks.py: SGLang prefaults them; pages are committed as the tier
fills), and its own budget check (free memory less our 1 GiB reserve, hicache/hooks.py) still runs. `k3 serve`
prints the choice at start. Pure functions: the caller reads /proc/meminfo (`mem_available_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

SHARE = 0.25        # of the memory free at start (MemAvailable), split over the ranks on this host
CAP_GB = 32         # per rank: a host tier beyond this is a deliberate choice (--hicache-size)
FALLBACK_RATIO = "2"  # SGLang's cache-mode default, when a GB per rank is not free


@dataclass(frozen=True)
class HostTier:
    """The host tier `k3 serve` chose: SGLang flags to append and the line it prints."""

    flags: tuple[str, ...]
    message: str


def host_tier(mem_available: int | None, ranks: int) -> HostTier:
    """The host tier for `ranks` ranks on a host with `mem_available` bytes free (None: unknown)."""
    if mem_available is None or mem_available <= 0:
        return HostTier(("--hicache-ratio", FALLBACK_RATIO),
                        "HiCache host tier: free memory unknown; SGLang's --hicache-ratio 2 (2 x the device pools)")
    free_gb = mem_available / 1e9
    per_rank = math.floor(SHARE * free_gb / max(ranks, 1))
    if per_rank < 1:
        return HostTier(("--hicache-ratio", FALLBACK_RATIO),
                        f"HiCache host tier: {SHARE:.0%} of {free_gb:.1f} GB free is under 1 GB per rank "
                        f"({ranks} ranks); SGLang's --hicache-ratio 2 (2 x the device pools)")
    size = min(CAP_GB, per_rank)
    capped = " (capped)" if size < per_rank else ""
    return HostTier(("--hicache-size", str(size)),
                    f"HiCache host tier: --hicache-size {size} GB per rank{capped} = {SHARE:.0%} of "
                    f"{free_gb:.1f} GB free / {ranks} rank(s), at most {CAP_GB} GB; "
                    "pass --hicache-size or --hicache-ratio to choose")


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
