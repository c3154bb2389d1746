"""A session's home when this router replica has no record of it: derived, so every replica derives the same. Pure.

Router replicas (same config, each subscribed to every worker's KV events) share no memory and run no protocol
between them. A session's turn may reach a replica that never saw the session (its first turn went to another
replica, or this replica restarted). Its home is then derived from what every replica sees alike:
1. the workers' KV events: the worker holding the deepest resumable KDA checkpoint the session stored (events carry
   the `X-Session-Id` every replica forwards) is its home; a cache is where the events say it is;
2. else, with `policy.session_home: rendezvous` and an explicit session id, rendezvous (highest-random-weight) hashing of the session id over
   the eligible workers: the first worker in `rendezvous_order(session_id, eligible)`. Every replica computes the
   same order from the same id and fleet, and a worker that leaves moves only the sessions it was first for.
The home is then weighed like a follow-up turn's (policy.decide: it stays unless another worker wins by more than
the move penalty), so replicas agree whenever their views of the fleet agree to within that penalty.
A keyless session (no `X-Session-Id`, `X-SMG-Routing-Key` or `user`) is identified per replica (its id and prefix
keys are process-local), so it gets no rendezvous home (a hash of an id no other replica knows would only pull its
turn away from its cache); its requests find their prefix through the events (exactly for token ids) and the
text inference, as on one replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from k3_sglang.router.event_feed import NONE, WorkerEventFeed

SCORE, RENDEZVOUS = "score", "rendezvous"
SESSION_HOMES = (SCORE, RENDEZVOUS)


def rendezvous_weight(session_id: str, worker_id: str) -> int:
    """The (process-independent) weight of `worker_id` for `session_id`: a 64-bit BLAKE2b of both."""
    digest = hashlib.blake2b(f"{session_id}\x00{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(session_id: str, worker_ids: Iterable[str]) -> list[str]:
    """`worker_ids` ordered by rendezvous weight for `session_id`, highest first (ties by id)."""
    return sorted(worker_ids, key=lambda w: (-rendezvous_weight(session_id, w), w))


def home_from_events(feeds: Mapping[str, WorkerEventFeed], session_id: str) -> tuple[str | None, int]:
    """(worker, tokens) where the events show the deepest resumable checkpoint `session_id` stored; (None, 0)."""
    best, best_tokens = None, 0
    for worker_id in sorted(feeds):  # sorted: equal depths on two workers resolve the same on every replica
        feed = feeds[worker_id]
        if feed.state == NONE:
            continue
        tokens = feed.index.session_resumable(session_id).tokens
        if tokens > best_tokens:
            best, best_tokens = worker_id, tokens
    return best, best_tokens


def derived_home(session_id: str, feeds: Mapping[str, WorkerEventFeed], eligible_ids: Iterable[str],
                 session_home: str) -> tuple[str | None, int, str]:
    """(home worker, its resumable tokens, how it was found: "events" / "rendezvous" / "") for a session this
    replica has no record of."""
    if feeds:
        worker, tokens = home_from_events(feeds, session_id)
        if worker is not None:
            return worker, tokens, "events"
    if session_home == RENDEZVOUS:
        order = rendezvous_order(session_id, eligible_ids)
        if order:
            return order[0], 0, RENDEZVOUS
    return None, 0, ""
