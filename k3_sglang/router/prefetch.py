"""Prefetch: when a turn's resumable prefix sits partly in the host or L3 tier, ask the worker to load it first.

The worker's KV events say per tier what it can resume (`Resumable.tokens` over all tiers, `device_tokens` on
the device alone); the gap between the two must be loaded back (SGLang HiCache) before the turn can use it.
The plan names the prefix by its token ids: the request's own ids, or for a text request the prefix the
session's deepest checkpoint covers (rebuilt from the blocks' published tokens). The prefetch is SGLang's own
`/generate` over that prefix with `max_new_tokens: 0`: admitting it makes the scheduler load the host blocks
(and fetch L3 ones) into the device cache, and it is queued on the worker ahead of the turn, which the router
forwards right after. Pure; `proxy.py` sends it (`send_prefetch`).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from k3_sglang.router.event_feed import NONE, WorkerEventFeed

log = logging.getLogger("k3.router.prefetch")
PREFETCH_PATH = "/generate"


@dataclass(frozen=True, slots=True)
class PrefetchPlan:
    """What to ask a worker to load: the prefix's token ids and how many of its tokens are off the device."""

    token_ids: list
    off_device_tokens: int
    session_id: str

    def body(self) -> bytes:
        """The `/generate` request that loads the prefix (no token is generated)."""
        return orjson.dumps({"input_ids": self.token_ids, "session_id": self.session_id,
                             "sampling_params": {"max_new_tokens": 0}})


def plan_prefetch(feed: WorkerEventFeed | None, session_id: str, token_ids: Sequence[int] | None,
                  min_tokens: int) -> PrefetchPlan | None:
    """A prefetch worth asking for on this worker, or None (nothing off the device, too little, or unknown)."""
    if feed is None or feed.state == NONE or min_tokens <= 0:
        return None
    index = feed.index
    if token_ids:
        found = index.match_tokens(token_ids, len(token_ids) - 1)
        prefix = list(token_ids[:found.tokens])
    else:
        found = index.session_resumable(session_id)
        h = index.session_checkpoint(session_id)
        prefix = index.prefix_tokens(h) if h is not None else None
    off_device = found.tokens - found.device_tokens
    if off_device < min_tokens or not prefix or len(prefix) * index.unit_tokens != found.tokens:
        return None
    return PrefetchPlan(prefix, off_device, session_id)


async def send_prefetch(session, worker_url: str, plan: PrefetchPlan, timeout_s: float) -> bool:
    """POST the prefetch and wait for its answer up to `timeout_s`; False when it failed (logged, not raised)."""
    try:
        async with session.post(worker_url + PREFETCH_PATH, data=plan.body(),
                                timeout=aiohttp.ClientTimeout(total=timeout_s),
                                headers={"Content-Type": "application/json", "X-Session-Id": plan.session_id}) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:  # a hint: never fails the turn
        log.debug("prefetch to %s failed: %r", worker_url, exc)
        return False
