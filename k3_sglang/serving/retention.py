"""Session retention on the worker: a finished turn that asked for T seconds keeps its radix path and KDA state.

The request guard carries the retention into the scheduler (`custom_params["__k3_retain_s"]`,
`session_fields.py`). Three methods of the `k3` radix cache (serving/radix_cache.py) call the functions here:
1. `checkpoint_into_tree` (AFTER): once a finished request's tokens and KDA state are in the tree
   (`req.last_node`, `req.kv.cache_protected_len` tokens), take one more tree lock on that node for T seconds:
   locked nodes, their ancestors and the node's KDA state are never evicted. One retention per session
   (`req.session_id`, else the request id): a new turn's lock replaces the previous turn's.
2. `_evict` (BEFORE): every eviction first releases retentions whose time is up (the only time
   an expired lock matters).
3. `reset` (AFTER): a reset tree holds no locks; the book forgets them without unlocking.
Bounded: retained tokens stay within `K3_RETAIN_SHARE` of the KV pool and retained sessions within that share
of the KDA state slots. A retention that does not fit first releases the retentions that expire soonest; one
larger than the whole share is trimmed to nothing (the turn is cached as usual, evictable). Never refused:
the request has already been served when its retention is booked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from k3_sglang.env_settings import EnvModel
from k3_sglang.serving.session_fields import retention_of

log = logging.getLogger(__name__)

BOOK_ATTR = "_k3_retention_book"


class RetentionSettings(EnvModel):
    """K3_RETAIN_MAX_S: longest retention granted (longer asks are clamped); K3_RETAIN_SHARE: share of the KV pool
    and of the KDA state slots retained sessions may hold (0 < share <= 1)."""

    ENV_PREFIX: ClassVar[str] = "K3_RETAIN_"
    max_s: float = Field(3600.0, ge=0)
    share: float = Field(0.25, gt=0, le=1)


@dataclass(slots=True)
class Retained:
    """One session's retention: the tree lock, until when, and the tokens it holds."""

    lock: Any
    until: float
    tokens: int


class RetentionBook:
    """Retentions of one cache, within `max_tokens` and `max_sessions`. Pure: locking is passed in."""

    def __init__(self, max_tokens: int, max_sessions: int) -> None:
        self.max_tokens, self.max_sessions = max(0, int(max_tokens)), max(0, int(max_sessions))
        self.entries: dict[str, Retained] = {}
        self.tokens = 0
        self.trimmed = 0   # retentions not granted (larger than the whole share)
        self.released = 0  # retentions released early to make room for newer ones

    def retain(self, key: str, tokens: int, seconds: float, now: float, lock: Callable[[], Any],
               unlock: Callable[[Any], None]) -> bool:
        """Book `key` for `seconds` (replacing its previous booking); False when trimmed to nothing."""
        self.expire(now, unlock)
        previous = self.entries.pop(key, None)
        if previous is not None:
            self.tokens -= previous.tokens
        granted = 0 < tokens <= self.max_tokens and self.max_sessions > 0 and seconds > 0
        if granted:
            while self.entries and (self.tokens + tokens > self.max_tokens or len(self.entries) >= self.max_sessions):
                soonest = min(self.entries, key=lambda k: self.entries[k].until)
                self._release(soonest, unlock)
                self.released += 1
            self.entries[key] = Retained(lock(), now + seconds, tokens)
            self.tokens += tokens
        else:
            self.trimmed += 1
        if previous is not None:
            unlock(previous.lock)  # after the new lock: a shared prefix stays protected throughout
        return granted

    def expire(self, now: float, unlock: Callable[[Any], None]) -> int:
        """Release every retention whose time is up; return how many."""
        done = [k for k, r in self.entries.items() if r.until <= now]
        for key in done:
            self._release(key, unlock)
        return len(done)

    def clear(self) -> None:
        """Forget every retention without unlocking (the tree was reset)."""
        self.entries.clear()
        self.tokens = 0

    def _release(self, key: str, unlock: Callable[[Any], None]) -> None:
        entry = self.entries.pop(key)
        self.tokens -= entry.tokens
        unlock(entry.lock)


def book_of(cache: Any) -> RetentionBook:
    """The cache's retention book, sized on first use from its KV pool and KDA state slots."""
    book = cache.__dict__.get(BOOK_ATTR)
    if book is None:
        share = RetentionSettings.from_env().share
        kv = getattr(getattr(cache, "token_to_kv_pool_allocator", None), "size", 0) or 0
        mamba = getattr(getattr(getattr(cache, "req_to_token_pool", None), "mamba_allocator", None), "size", None)
        slots = int(mamba * share) if mamba else 1 << 30
        book = cache.__dict__[BOOK_ATTR] = RetentionBook(int(kv * share), slots)
    return book


def retain_finished_turn(result, cache, req, *args, **kwargs):
    """(1) after SGLang's checkpoint_into_tree: book the retention a finished request asked for."""
    sampling = getattr(req, "sampling_params", None)
    seconds = retention_of(getattr(sampling, "custom_params", None))
    if not seconds or getattr(cache, "disable", False) or not req.finished() or req.last_node is None:
        return result
    tokens = int(req.kv.cache_protected_len or 0)
    key = req.session_id or req.rid
    node = req.last_node
    book = book_of(cache)
    if not book.retain(key, tokens, seconds, time.monotonic(), lambda: cache.lock(node), cache.unlock):
        log.info("retention of %s (%d tokens) trimmed: larger than the retained share (%d tokens, %d sessions)",
                 key, tokens, book.max_tokens, book.max_sessions)
    return result


def release_expired(cache, *args, **kwargs):
    """(2) before SGLang's _evict: expired retentions go before SGLang evicts."""
    book = cache.__dict__.get(BOOK_ATTR)
    if book is not None and book.entries:
        book.expire(time.monotonic(), cache.unlock)
    return None


def forget_on_reset(result, cache, *args, **kwargs):
    """(3) after SGLang's reset: the tree was emptied, and its locks with it."""
    book = cache.__dict__.get(BOOK_ATTR)
    if book is not None:
        book.clear()
    return result
