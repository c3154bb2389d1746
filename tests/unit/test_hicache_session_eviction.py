"""The host tier's session eviction policy (k3_sglang/hicache/session_eviction.py): the rank, the access clock, the
driver on a toy host tier under round-robin sessions larger than it (SGLang's LRU order hits nothing, the policy
resumes a stable set), and the SGLang hook against the Python TreeCore's names (end to end:
tests/e2e/test_session_eviction_slow.py)."""
from __future__ import annotations

import inspect
import itertools

import pytest

from k3_sglang.hicache.session_eviction import (
    FINISHED,
    PAUSED,
    AccessClock,
    drive_session_eviction,
    victim_rank,
)


def test_rank_finished_sessions_oldest_first_then_paused_most_recent_first():
    horizon = 600
    finished_old, finished_new = victim_rank(1, 900, horizon), victim_rank(5, 700, horizon)
    paused_old, paused_new = victim_rank(10, 30, horizon), victim_rank(20, 1, horizon)
    assert finished_old[0] == finished_new[0] == FINISHED and paused_old[0] == paused_new[0] == PAUSED
    assert sorted([paused_old, finished_new, paused_new, finished_old]) == [
        finished_old, finished_new, paused_new, paused_old]
    assert victim_rank(3, 600, horizon)[0] == FINISHED  # the horizon itself counts as finished


def test_access_clock_maps_the_logical_counter_to_time():
    clock = AccessClock(resolution_s=1.0)
    assert clock.idle_s(5) == 0.0  # nothing sampled: unknown counts as just used
    clock.sample(10, 100.0)
    clock.sample(11, 100.5)  # within the resolution: not kept, but "now" moves
    clock.sample(20, 200.0)
    clock.sample(15, 300.0)  # the counter went back: not kept
    assert clock.now == 300.0
    assert clock.idle_s(5) == 200.0  # accessed before the sample (10, 100 s): idle at least 200 s
    assert clock.idle_s(10) == 100.0  # at 10 itself: before the sample (20, 200 s)
    assert clock.idle_s(25) == 0.0
    clock.sample(30, 0.0)  # no creation time: ignored
    assert clock.counters == [10, 20]


def test_access_clock_stays_bounded_and_keeps_its_oldest_sample():
    clock = AccessClock(resolution_s=0.0, max_samples=8)
    for i in range(1, 100):
        clock.sample(i, float(i))
    assert len(clock.counters) <= 8 and clock.counters[0] == 1
    assert clock.idle_s(0) == clock.now - 1.0


class Node:
    """A toy radix node: `tokens` of KV in the host tier, a parent, children in the tier."""

    ids = itertools.count()

    def __init__(self, parent, tokens, stamp):
        self.parent, self.tokens, self.last_access, self.children = parent, tokens, stamp, set()
        self.id = next(self.ids)
        if parent is not None:
            parent.children.add(self)


class ToyTier:
    """A host tier of `capacity` tokens holding session chains below a root. A turn matches the longest chain of
    its session still held (its hit), then writes the rest of its history and the new turn, evicting with
    `rank` (drive_session_eviction) whenever the tier is full; the running session's own nodes are locked."""

    def __init__(self, capacity, rank):
        self.capacity, self.rank, self.used = capacity, rank, 0
        self.clock = itertools.count(1)
        self.root = Node(None, 0, 0)
        self.heads = {}  # session -> its chunk nodes from the root, as far as the tier holds them

    def leaves(self, locked):
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node is not self.root and not node.children and node not in locked:
                out.append(node)
        return sorted(out, key=lambda n: (n.last_access, n.id))

    def evict(self, node):
        node.parent.children.discard(node)
        self.used -= node.tokens
        node.evicted = True

    def make_room(self, need, locked):
        drive_session_eviction(
            self.leaves(locked), rank=self.rank,
            is_leaf=lambda n: not getattr(n, "evicted", False) and not n.children and n not in locked,
            parent=lambda n: None if n.parent is self.root else n.parent,
            evict=self.evict, done=lambda: self.capacity - self.used >= need)

    def turn(self, session, chunks):
        """Serve one turn of `session` whose history is `chunks` token counts (the last one new). Returns the
        tokens it found cached."""
        # eviction takes leaves only, so what is left of a session's chain is a prefix of it
        held = list(itertools.takewhile(lambda n: not getattr(n, "evicted", False), self.heads.get(session, [])))
        stamp = next(self.clock)
        for i, node in enumerate(reversed(held)):
            node.last_access = stamp - 1e-5 * i
        hit = sum(n.tokens for n in held)
        locked = set(held)
        parent = held[-1] if held else self.root
        for tokens in chunks[len(held):]:
            self.make_room(tokens, locked)
            if self.capacity - self.used < tokens:
                break  # the tier cannot hold the rest of this session
            node = Node(parent, tokens, next(self.clock))
            self.used += tokens
            locked.add(node)
            held.append(node)
            parent = node
        self.heads[session] = held
        return hit


def round_robin_hits(rank, sessions=6, fits=3, rounds=5, chunk=256, chunks_first=5):
    """Per turn from the third round on (the first rounds' sessions are smaller than the tier): tokens found cached /
    history, on a tier holding `fits` sessions' histories at the end of the run."""
    final = (chunks_first + rounds - 1) * chunk
    tier = ToyTier(capacity=fits * final, rank=rank)
    fractions = []
    for r in range(rounds):
        for s in range(sessions):
            chunks = [chunk] * (chunks_first + r)
            hit = tier.turn(s, chunks)
            if r >= 2:
                fractions.append(hit / (chunk * (chunks_first + r - 1)))
    return fractions


def lru(node):
    return (0, node.last_access)  # SGLang's order for the host tier


def sessions(node):
    return victim_rank(node.last_access, 0.0, horizon_s=600)


def test_lru_hits_nothing_when_round_robin_sessions_exceed_the_tier():
    assert max(round_robin_hits(lru)) == 0.0  # the collapse, reproduced


def test_session_policy_resumes_a_stable_set_of_whole_sessions():
    fractions = round_robin_hits(sessions)  # measured: 0.58 of the history on average, LRU 0
    assert sum(fractions) / len(fractions) > 0.4
    assert sum(f >= 0.5 for f in fractions) >= len(fractions) // 2
    # all sessions fit: every turn resumes its whole history under both orders
    assert min(round_robin_hits(sessions, sessions=3, fits=3)) == 1.0
    assert min(round_robin_hits(lru, sessions=3, fits=3)) == 1.0


def test_finished_sessions_go_first_so_new_sessions_are_not_locked_out():
    """Sessions idle past the horizon are evicted oldest first: a tier full of finished sessions takes new ones."""
    old_ids = set()

    def finished_then_new(node):
        return victim_rank(node.last_access, 10_000.0 if node.id in old_ids else 0.0, horizon_s=600)

    tier = ToyTier(capacity=3 * 1024, rank=finished_then_new)
    for s in range(3):
        tier.turn(s, [512, 512])
    old_ids.update(n.id for s in range(3) for n in tier.heads[s])
    for _ in range(3):
        for s in (10, 11):  # two new sessions round robin: they must keep resuming
            tier.turn(s, [512, 512])
    assert tier.turn(10, [512, 512, 64]) == 1024 and tier.turn(11, [512, 512, 64]) == 1024


def test_driver_evicts_one_session_towards_its_root_before_the_next():
    root = Node(None, 0, 0)
    a1 = Node(root, 10, 1)
    a2 = Node(a1, 10, 2)
    b1 = Node(root, 10, 3)
    b2 = Node(b1, 10, 1.5)  # older than a2, but it belongs to the session ranked after a
    gone = []

    def evict(n):
        gone.append(n)
        n.parent.children.discard(n)

    drive_session_eviction([b2, a2], rank=lambda n: (PAUSED, -n.last_access) if n is not a2 else (PAUSED, -9),
                           is_leaf=lambda n: not n.children and n not in gone, parent=lambda n: n.parent
                           if n.parent is not root else None, evict=evict, done=lambda: len(gone) >= 3)
    assert gone == [a2, a1, b2]


# -- in SGLang: the `k3` radix cache's session TreeCore ------------------------------------------------------------------------------------------------

def test_the_tree_core_names_the_policy_uses_exist():
    from sglang.srt.mem_cache.unified_cache import unified_tree_core
    from sglang.srt.mem_cache.unified_cache.components import base
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from k3_sglang.hicache.session_eviction import COUNTER_NAME
    from k3_sglang.serving.radix_cache import K3RadixCache, K3SessionTreeCore

    core = unified_tree_core.UnifiedTreeCore
    assert list(inspect.signature(core.drive_host_eviction).parameters) == ["self", "component_type", "num_tokens"]
    assert list(inspect.signature(core._evict_host_leaf).parameters)[:6] == [
        "self", "node", "tracker", "device_frees", "host_frees", "cache_actions"]
    init = inspect.getsource(core.__init__) + inspect.getsource(core)
    assert "self.evictable_host_leaves" in init and "self.enable_session_radix_cache" in init
    assert isinstance(getattr(base, COUNTER_NAME), float)
    assert "params" in inspect.signature(UnifiedRadixCache.match_prefix).parameters
    assert issubclass(K3SessionTreeCore, core) and "drive_host_eviction" in vars(K3SessionTreeCore)
    assert issubclass(K3RadixCache, UnifiedRadixCache) and "match_prefix" in vars(K3RadixCache)


class StubCore:
    """The Python TreeCore's names the hook uses: host leaves of a toy tree, each freeing `tokens`."""

    def __init__(self, leaves):
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        self.ct = ComponentType.FULL
        self.is_write_back = False
        self.enable_session_radix_cache = False
        self.evictable_host_leaves = set(leaves)
        self.evicted = []

    def _evict_host_leaf(self, node, tracker, device_frees, host_frees, cache_actions):
        self.evicted.append(node)
        self.evictable_host_leaves.discard(node)
        tracker[self.ct] += node.tokens
        if node.parent is not None and node.parent.tokens and not (node.parent.children - {node}):
            self.evictable_host_leaves.add(node.parent)
        node.parent.children.discard(node)


def test_hook_evicts_the_most_recent_paused_session_whole_and_leaves_the_rest_to_sglang():
    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import DriveHostEvictionResult

    from k3_sglang.hicache import session_eviction_hooks as hooks

    root = Node(None, 0, 0)
    old = Node(root, 100, 1)
    new1 = Node(root, 100, 2)
    new2 = Node(new1, 100, 3)
    for n in (root, old, new1, new2):
        n.last_access_time = n.last_access
    core = StubCore([old, new2])
    calls = []

    def original(core_, ct, n):
        calls.append(n)
        out = DriveHostEvictionResult()
        out.tracker[ct] += n
        out.host_frees[ct].append("sglang's")
        return out

    result = hooks.evict_host_by_session(original, core, core.ct, 150)
    assert core.evicted == [new2, new1] and calls == [] and result.tracker[core.ct] == 200
    core2 = StubCore([old])
    result2 = hooks.evict_host_by_session(original, core2, core2.ct, 250)
    assert core2.evicted == [old] and calls == [150]  # the remainder, from SGLang's own pass
    assert result2.tracker[core2.ct] == 250 and result2.host_frees[core2.ct] == ["sglang's"]
    for r in (result, result2):
        r.host_frees.clear()
    core3 = StubCore([old])
    core3.is_write_back = True  # not exercised on CPU: SGLang's own eviction
    hooks.evict_host_by_session(original, core3, core3.ct, 10).host_frees.clear()
    assert core3.evicted == [] and calls == [150, 10]


def test_settings_and_serve_env(monkeypatch):
    from k3_sglang.hicache.serve_flags import cpu_hicache_env
    from k3_sglang.hicache.settings import HiCacheSettings

    assert HiCacheSettings.from_env({}).eviction == "lru"
    with pytest.raises(ValueError, match="K3_HICACHE_EVICTION"):
        HiCacheSettings.from_env({"K3_HICACHE_EVICTION": "mru"})
    for eviction in ({}, {"K3_HICACHE_EVICTION": "sessions"}, {"K3_HICACHE_EVICTION": "lru"}):
        # the policy needs no server-wide TreeCore: the `k3` cache picks its own (serving/radix_cache.py)
        assert cpu_hicache_env(["--enable-hierarchical-cache"], "127.0.0.1", eviction) == eviction
    assert cpu_hicache_env([], "127.0.0.1", {}) == {}


def test_k3_serve_refuses_a_bad_eviction_setting_and_serves_the_k3_cache(monkeypatch, capsys, tmp_path):
    from k3_sglang.cli import main

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", raising=False)
    monkeypatch.setenv("K3_HICACHE_EVICTION", "mru")
    assert main(["serve", "--dry-run", "--enable-hierarchical-cache"]) == 2
    assert "K3_HICACHE_EVICTION must be one of sessions, lru, got 'mru'" in capsys.readouterr().err
    for eviction in ("lru", "sessions"):  # SGLang's LRU, or by session: the k3 cache either way, no core variable
        monkeypatch.setenv("K3_HICACHE_EVICTION", eviction)
        assert main(["serve", "--dry-run", "--dtype", "float32", "--enable-hierarchical-cache"]) == 0
        out = capsys.readouterr().out
        assert "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND" not in out and "--radix-cache-backend k3" in out


def test_k3_serve_exits_2_when_the_mooncake_master_is_down_at_start(monkeypatch, capsys, tmp_path):
    """Issue 42's acceptance, through the command line: a master that does not answer is refused before any server
    starts (exit 2, the address and the reason)."""
    from k3_sglang.cli import main
    from k3_sglang.net import free_port

    monkeypatch.setenv("K3_CACHE_DIR", str(tmp_path))
    down = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("MOONCAKE_MASTER", down)
    assert main(["serve", "--dry-run", "--dtype", "float32", "--enable-hierarchical-cache",
                 "--hicache-storage-backend", "mooncake"]) == 2
    err = capsys.readouterr().err
    assert f"the Mooncake master at {down} does not answer" in err and "start it first" in err
