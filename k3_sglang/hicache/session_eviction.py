"""Host-tier eviction for paused agent sessions (issue 42): whole sessions, the most recently paused first.

Why. SGLang evicts the host tier (L2) least recently used first. Round-robin agent sessions whose paused histories
exceed the tier are the textbook case where LRU hits nothing: the session a turn needs is always the one paused
longest, so it is always the one evicted just before it returns (measured: every resumed turn recomputed).

Policy. A host leaf (a node whose KV lives only in the host tier, with no children there) belongs to one paused
session's tail. Victims are ranked per leaf (`victim_rank`, smallest first):
1. sessions presumed finished, idle for at least `K3_HICACHE_EVICT_IDLE_S` (600 s): least recently used first;
2. every other paused session: most recently used first. Under round robin (and any traffic whose sessions come
   back at a similar period) the session paused last is the one whose next turn is furthest away: Belady's choice.
   The tier then keeps a stable set of whole sessions and resumes them, instead of keeping the tails of sessions
   that are all evicted before they return.
Once a session is picked, its tail is evicted leaf by leaf towards its root (`drive_session_eviction`: a parent that
becomes a host leaf inherits the rank of the child just evicted), so what is freed comes from one session and the
rest keep their whole history; a session is evicted only as far as the space requested (its prefix, and the KDA
states on it, stay).

Idle time, the same on every TP / DCP rank. SGLang stamps nodes with a logical access counter, not wall time, and
every rank must evict the same nodes (their host pools and trees stay in step). `AccessClock` maps the counter to
the tokenizer's creation time of the requests that touched the tree (`req.time_stats.created_time`, broadcast to
every rank), sampled when a request matches its prefix; "now" is the newest such time. Without creation times every
paused session ranks in class 2 (the order stays deterministic).

Seam: the `k3` radix-cache backend (serving/radix_cache.py, SGLang's public `register_radix_cache_backend`): its
cache samples the clock in `match_prefix`, and under this policy it runs on `K3SessionTreeCore`, SGLang's Python
TreeCore (registered through SGLang's public `register_tree_core_backend`, picked for that cache alone through
`CacheInitParams.tree_core_backend`) whose `drive_host_eviction` (the host tier's only eviction entry, for the KV
pages and the KDA states alike) evicts by session. SGLang's Rust TreeCore (its default) evicts natively with no
per-node seam, which is why this policy brings the Python one.
`K3_HICACHE_EVICTION=lru` keeps SGLang's own eviction and core. Write-back mode and SGLang's session radix cache
keep SGLang's own eviction (not exercised on CPU). What the policy frees short of the request (KDA states held only
by internal nodes) is left to SGLang's own pass.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any

COUNTER_MODULE = "sglang.srt.mem_cache.unified_cache.components.base"
COUNTER_NAME = "_LAST_ACCESS_TIME_COUNTER_FLOAT"

FINISHED, PAUSED = 0, 1  # victim classes, evicted in this order


def victim_rank(last_access: float, idle_s: float, horizon_s: float) -> tuple[int, float]:
    """Sort key of a host leaf, smallest evicted first: (FINISHED, last_access) for a session idle >= horizon_s
    (oldest first), else (PAUSED, -last_access) (most recently used first)."""
    if idle_s >= horizon_s:
        return (FINISHED, last_access)
    return (PAUSED, -last_access)


class AccessClock:
    """Maps SGLang's logical access counter to (tokenizer) wall time: samples (counter, time) with both increasing,
    at most one per `resolution_s`, at most `max_samples` (thinned by half when full, so the span covered grows)."""

    def __init__(self, resolution_s: float = 1.0, max_samples: int = 4096) -> None:
        self.resolution_s = resolution_s
        self.max_samples = max(2, max_samples)
        self.counters: list[float] = []
        self.times: list[float] = []
        self.now = 0.0

    def sample(self, counter: float, when: float) -> None:
        """Record that the counter stood at `counter` at time `when` (ignored unless both move forward)."""
        if when <= 0:
            return
        self.now = max(self.now, when)
        if self.counters and (counter <= self.counters[-1] or self.now - self.times[-1] < self.resolution_s):
            return
        self.counters.append(counter)
        self.times.append(self.now)
        if len(self.counters) > self.max_samples:
            self.counters, self.times = self.counters[::2], self.times[::2]

    def idle_s(self, counter: float) -> float:
        """At least how long before `now` an access stamped `counter` happened: now - the time of the first sample
        taken after it (0 when none was)."""
        i = bisect.bisect_right(self.counters, counter)
        return self.now - self.times[i] if i < len(self.counters) else 0.0


def drive_session_eviction(leaves: Iterable[Any], rank: Callable[[Any], tuple], is_leaf: Callable[[Any], bool],
                           parent: Callable[[Any], Any], evict: Callable[[Any], None],
                           done: Callable[[], bool]) -> int:
    """Evict host leaves in `rank` order until `done()`: after a leaf is evicted, its parent (once `is_leaf`) is
    queued with the evicted leaf's rank, so one session is evicted towards its root before the next is touched.
    Ties keep the order of `leaves`. Returns how many leaves were evicted."""
    order = itertools.count()
    heap = [(rank(n), next(order), n) for n in leaves]
    heapq.heapify(heap)
    evicted = 0
    while heap and not done():
        key, _, node = heapq.heappop(heap)
        if not is_leaf(node):
            continue  # stale: no longer a host leaf
        up = parent(node)
        evict(node)
        evicted += 1
        if up is not None and is_leaf(up):
            heapq.heappush(heap, (key, next(order), up))
    return evicted
