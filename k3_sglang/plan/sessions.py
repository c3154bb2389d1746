"""Cached agent sessions: how many paused sessions (between turns) a server keeps, on device and on host.

A session paused between turns is held by SGLang's radix tree: its MLA latent rows (KV pool) and the KDA states of
its path (state pool). SGLang stores one KDA state per prefill chunk and one per finished turn on a session's path
(`no_buffer`: a copy per chunk; `extra_buffer`: the track slots), so without a cap a 6K-token session prefilled in
512-token chunks holds 12 states, and a 64-slot pool caches five such sessions although the KV pool holds twenty
(issue 31: the sixth round-robin session got 0% hits). Two levers, both SGLang's own flags:

- `--mamba-max-states-per-path P`: after each insert SGLang drops the shallowest interior states beyond P (tail,
  forks and locked nodes kept); a cached session then holds at most P states.
- `--max-mamba-cache-size`: sized here so the state pool never binds before the KV pool for sessions of at least
  `min_session_tokens`, while every running request keeps SGLang's S slots:

      slots = S * max_running + P * ceil(kv_tokens / min_session_tokens)

Host (HiCache L2): one session needs its latent rows (session tokens / dcp per rank) and its KDA states; the host
budget is split between the two in that proportion (the workload's, not the device pools').
All functions are pure (no SGLang import): `k3 serve` sizes the CPU defaults with them, `k3 plan` reports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from k3_sglang.plan.errors import PlanError

DEFAULT_STATES_PER_PATH = 2     # tail + the previous turn's end: a resumed or re-edited turn still finds a state
UNCAPPED = -1                   # SGLang's --mamba-max-states-per-path default (no cap)
DEFAULT_PREFILL_CHUNK = 8192    # SGLang's chunked-prefill default on large GPUs (used only when uncapped)
CPU_MIN_SESSION_TOKENS = 1024   # `k3 serve` on CPU: sessions of >= 1K tokens are bounded by the KV pool
MAMBA_TRACK_INTERVAL = 256      # SGLang's --mamba-track-interval default (extra_buffer: one tracked state per interval)


def states_per_cached_session(session_tokens: int, chunk_tokens: int, cap: int) -> int:
    """KDA states one cached session holds: one per prefill chunk plus the finished turn's, at most `cap`
    (UNCAPPED: no cap)."""
    uncapped = math.ceil(session_tokens / chunk_tokens) + 1
    return uncapped if cap == UNCAPPED else min(cap, uncapped)


def device_state_slots(kv_tokens: int, max_running: int, slots_per_request: int, states_per_session: int,
                       min_session_tokens: int) -> int:
    """State slots so that `max_running` requests keep SGLang's S slots each and cached sessions of at least
    `min_session_tokens` tokens are bounded by the KV pool (`kv_tokens`), not by the state pool."""
    return slots_per_request * max_running + states_per_session * math.ceil(kv_tokens / min_session_tokens)


@dataclass(frozen=True)
class CachedSessions:
    """Paused sessions one pool pair holds: the ceiling of each pool."""

    by_kv: int
    by_state: int

    @property
    def sessions(self) -> int:
        """The smaller ceiling."""
        return min(self.by_kv, self.by_state)

    @property
    def binding(self) -> str:
        """Which pool binds: 'kv' or 'state' (ties: 'kv', the pool that should bind)."""
        return "kv" if self.by_kv <= self.by_state else "state"


def device_cached_sessions(kv_tokens: int, state_slots: int, session_tokens: int, states_per_session: int,
                           kv_granule: int = 1) -> CachedSessions:
    """Paused sessions of `session_tokens` a device pool pair keeps (KV rounded up to `kv_granule`-token pages)."""
    per_session = -(-session_tokens // kv_granule) * kv_granule
    return CachedSessions(kv_tokens // per_session, state_slots // states_per_session)


@dataclass(frozen=True)
class HostSplit:
    """A HiCache host budget split between latent rows and KDA states in the workload's proportion."""

    kv_bytes: int
    state_bytes: int
    kv_bytes_per_session: int
    state_bytes_per_session: int

    @property
    def sessions(self) -> int:
        """Paused sessions the host tier holds."""
        return min(self.kv_bytes // self.kv_bytes_per_session, self.state_bytes // self.state_bytes_per_session)

    @property
    def kv_fraction(self) -> float:
        """Share of the host budget given to latent rows."""
        return self.kv_bytes / (self.kv_bytes + self.state_bytes)


def host_split(host_bytes: int, session_tokens: int, kv_bytes_per_token: int, slot_bytes: int,
               states_per_session: int, dcp: int = 1) -> HostSplit:
    """Split `host_bytes` (one rank's HiCache host pool) for sessions of `session_tokens` tokens.

    Per rank a session's latent rows are session_tokens / dcp x kv_bytes_per_token (DCP stripes tokens), its KDA
    states states_per_session x slot_bytes (KDA state is not DCP-sharded). Raises PlanError("host-memory") when the
    budget cannot hold one session."""
    kv_per = -(-session_tokens // dcp) * kv_bytes_per_token
    state_per = states_per_session * slot_bytes
    per_session = kv_per + state_per
    if host_bytes < per_session:
        raise PlanError("host-memory", f"a host tier of {host_bytes / (1 << 30):.3f} GiB per rank cannot hold one "
                        f"session of {session_tokens:,} tokens: it needs {kv_per / (1 << 30):.3f} GiB of latent rows "
                        f"+ {state_per / (1 << 30):.3f} GiB of KDA state ({states_per_session} x "
                        f"{slot_bytes / (1 << 20):.1f} MiB) = {per_session / (1 << 30):.3f} GiB")
    kv_bytes = host_bytes * kv_per // per_session
    return HostSplit(kv_bytes, host_bytes - kv_bytes, kv_per, state_per)
