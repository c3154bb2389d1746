"""The ledger follows the events: where a worker publishes KV events, the residency placement charges (resident
tokens and states, the KV barrier) is what the worker says it holds, not every session the router placed there.

The issue-41 case: two workers with 6K-token pools, a prefix put on w0 directly (not through the router), two
earlier sessions placed on w0 that the worker has since evicted. A request for the prefix must go to w0 and reuse
it; the old ledger kept both sessions until their TTL, filled w0's KV barrier and sent it to w1 with 0 cached.
"""

from __future__ import annotations

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import NEW, RouteRequest
from tests.router.test_event_placement import checkpoint, publish, stored

POOL = 6_144
PAGE = 256
CFG = PolicyConfig(session_ttl_s=1_800.0)  # the defaults a new user gets (headroom 5%, barrier 0.25 s)


def make_core() -> RouterCore:
    core = RouterCore(CFG)
    for w in ("w0", "w1"):
        core.add_worker(w, Capacity(POOL, 64, 8_000.0))
        publish(core, w, [])  # both publish: synced, empty
    return core


def put_prefix(core: RouterCore, worker: str, ids: list[int], first_hash: int, session=None) -> list[int]:
    """Publish `ids` as stored on `worker` (full pages) with a KDA checkpoint at its end; return the hashes."""
    hashes = [first_hash + i for i in range(len(ids) // PAGE)]
    publish(core, worker, [stored(hashes, ids[:len(hashes) * PAGE], session=session, size=PAGE),
                           checkpoint(hashes[-1], len(hashes) * PAGE, session=session)])
    return hashes


def run_turn(core: RouterCore, request: RouteRequest, now: float, exclude=()):
    decision, ticket = core.route(request, (), now, exclude=exclude)
    assert ticket is not None, decision
    core.complete(ticket, now, ok=True, output_tokens=request.growth_tokens)
    return decision


def test_an_evicted_session_stops_weighing_on_its_old_worker():
    core = make_core()
    prefix = list(range(1_000, 1_000 + 2_048))
    put_prefix(core, "w0", prefix, 10_000)  # sent to w0 directly: the router never saw it
    # two earlier sessions the router placed on w0 (w1 excluded, as a burst elsewhere would); w0 then evicts them
    for n, sid in enumerate(("s1", "s2")):
        ids = [50_000 * (n + 1) + i for i in range(2_048)]
        run_turn(core, RouteRequest(sid, 2_048, 100), float(n), exclude=("w1",))
        hashes = put_prefix(core, "w0", ids, 20_000 * (n + 1), session=sid)
        publish(core, "w0", [{"type": "BlockRemoved", "block_hashes": hashes[::-1], "medium": "GPU"}])
    w0 = core.fleet.workers["w0"]
    assert w0.resident_sessions == 2 and w0.resident_tokens >= 4_000  # the ledger still holds both
    assert core.event_feeds["w0"].index.resident_tokens == 2_048  # the worker holds the prefix only
    for k in range(15):  # as the 15 tries: each a new session with the prefix and its own question
        ids = prefix + [900_000 + 1_000 * k + i for i in range(100)]
        decision = run_turn(core, RouteRequest(f"new{k}", len(ids), 512, token_ids=ids), 10.0 + k)
        assert (decision.kind, decision.worker_id, decision.cached_tokens) == (NEW, "w0", 2_048), (k, decision)


def test_a_flush_empties_the_residency_the_policy_charges():
    core = make_core()
    put_prefix(core, "w0", list(range(5_000)), 1)  # w0 almost full, by its events
    ids = list(range(100_000, 102_000))
    assert run_turn(core, RouteRequest("a", len(ids), 512, token_ids=ids), 0.0).worker_id == "w1"
    publish(core, "w0", [{"type": "AllBlocksCleared"}])  # /flush_cache on w0
    assert core.event_feeds["w0"].index.resident_tokens == 0
    ids = list(range(200_000, 202_000))
    assert run_turn(core, RouteRequest("b", len(ids), 512, token_ids=ids), 1.0).worker_id == "w0"


def test_in_flight_work_not_yet_published_still_counts():
    """A request in flight pins its KV before its blocks are published: residency never drops below it."""
    core = make_core()
    decision, ticket = core.route(RouteRequest("big", 5_000, 500), (), 0.0)
    assert ticket is not None and core.event_feeds[decision.worker_id].index.resident_tokens == 0
    ids = list(range(300_000, 302_000))
    other = run_turn(core, RouteRequest("b", len(ids), 512, token_ids=ids), 0.5)
    assert other.worker_id != decision.worker_id
    core.complete(ticket, 1.0, ok=True, output_tokens=10)
