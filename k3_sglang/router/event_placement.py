"""What the workers' KV events say a request could resume, per worker, for the placement policy. Pure.

For each eligible worker with an event feed that has received something:
- a request with token ids (`input_ids`, a token prompt): the resumable prefix of those ids (`match_tokens`),
  covering prefixes shared across sessions exactly;
- a request without (chat text): the deepest resumable checkpoint the session itself stored there
  (`session_resumable`; workers learn the router's session id from the `X-Session-Id` it forwards).
The answer is *authoritative* when the feed is `synced` and the question covers the request's own prefix
(token ids, or the session's home worker): the policy then uses it as is, so a session whose cache was
evicted is known to be cold. Otherwise (a `partial` feed, or a text request on a worker that is not the
session's home, where a shared system prompt may be cached that session ids cannot show) the policy takes
the larger of it and its text inference. Workers whose feed is `none` are left out (text inference only).
A `synced` feed also says what the worker holds (`resident_tokens`: its device-tier KV blocks; `resident_states`:
its device-tier KDA checkpoints): the policy charges that residency instead of the router's ledger of placed
sessions, so a session the worker flushed or evicted stops weighing on it (issue 41).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from k3_sglang.router.event_feed import NONE, SYNCED, WorkerEventFeed
from k3_sglang.router.event_index import NOTHING, Resumable


@dataclass(frozen=True, slots=True)
class EventView:
    """Resumable tokens on one worker by its events, and whether the policy may take them as the truth."""

    resumable: Resumable
    authoritative: bool
    resident_tokens: int | None = None  # device-tier KV tokens the worker holds (synced feeds only)
    resident_states: int | None = None  # device-tier KDA states it holds (synced feeds only)

    @property
    def tokens(self) -> int:
        return self.resumable.tokens


def event_views(feeds: Mapping[str, WorkerEventFeed], workers: Iterable, session_id: str,
                token_ids: Sequence[int] | None, home_id: str | None) -> dict[int, EventView]:
    """worker bit -> EventView for each worker in `workers` (WorkerState) whose feed has events."""
    views: dict[int, EventView] = {}
    for worker in workers:
        feed = feeds.get(worker.worker_id)
        if feed is None or feed.state == NONE:
            continue
        synced = feed.state == SYNCED
        index = feed.index
        tokens, states = (index.resident_tokens, index.device_states) if synced else (None, None)
        if token_ids:
            # SGLang matches at most len - 1 tokens: the last one is always computed
            views[worker.bit] = EventView(index.match_tokens(token_ids, len(token_ids) - 1), synced, tokens, states)
        else:
            found = index.session_resumable(session_id) if session_id else NOTHING
            views[worker.bit] = EventView(found, synced and worker.worker_id == home_id, tokens, states)
    return views


def cached_tokens(view: EventView | None, inferred: int, context_tokens: int) -> int:
    """The cached prefix the policy uses: the events' answer when authoritative, else the larger of the two."""
    if view is None:
        return inferred
    tokens = min(context_tokens, view.tokens)
    return tokens if view.authoritative else max(tokens, inferred)


def residency(view: EventView | None, worker, own_tokens: int) -> tuple[int, int, int]:
    """(resident tokens, resident sessions/states, the part of them the request reuses) the policy charges on a
    worker (WorkerState): what its synced events say it holds (never less than the KV and state slots its
    in-flight requests pin, which may not be published yet) and the resumable prefix already among them;
    else the router's ledger and `own_tokens` (the session's reservation on its home, 0 elsewhere)."""
    if view is None or view.resident_tokens is None:
        return worker.resident_tokens, worker.resident_sessions, own_tokens
    tokens = max(view.resident_tokens, worker.active_tokens)
    return tokens, max(view.resident_states, worker.inflight_requests), min(view.tokens, tokens)
