"""Session identity for keyless requests: the live session whose last request this one extends.

Every request carries *prefix keys* (shallow to deep), each an int naming one whole prefix of the
request: chained block hashes for raw prompts and token ids, block chain plus exact tail at each
message boundary for chat (`session_key.py`). A session's *tip* is the key of the end of its
latest request. A keyless request continues session S when S's tip is the deepest tip among the
request's keys -- the longest prefix that is exactly where some session left off -- and S is the
only session ever seen through that key. A key that two sessions went through (a shared system
prompt, two conversations that opened identically and then diverged) is *shared* and names no one,
so a new conversation behind a popular opening is a new session, never a merge.

Because each key names its whole prefix (chaining), the radix tree needs no explicit nodes: the
tips plus a bounded LRU map `key -> the one session seen through it (or SHARED)` answer the
longest-prefix query with one reverse scan of the request's keys. Pure; no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

SHARED = ""  # owner marker of a key two sessions went through (never a valid session id)


class SessionIndex:
    """Tips of live keyless sessions and the owners of prefix keys seen (LRU-bounded)."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max(1, int(max_keys))
        self._tips: dict[int, str] = {}
        self._tip_of: dict[str, int] = {}
        self._seen: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        """Sessions that have a tip."""
        return len(self._tip_of)

    @property
    def keys_seen(self) -> int:
        """Prefix keys remembered (bounded by `max_keys`)."""
        return len(self._seen)

    def find(self, keys: Sequence[int]) -> str | None:
        """The session this request continues: owner of the deepest tip in `keys`, unless shared."""
        tips, seen = self._tips, self._seen
        for key in reversed(keys):
            owner = tips.get(key)
            if owner is not None:
                return owner if seen.get(key) == owner else None
        return None

    def record(self, session_id: str, keys: Sequence[int], move_tip: bool = True) -> None:
        """A request of `session_id` with these keys was placed: mark them seen, move the tip.

        `move_tip=False` (explicitly keyed sessions) only marks the keys, so keyless requests never
        attach to a keyed session but do see that its prefix is not private.
        """
        seen = self._seen
        for key in keys:
            previous = seen.pop(key, None)
            seen[key] = session_id if previous is None or previous == session_id else SHARED
        while len(seen) > self.max_keys:
            seen.popitem(last=False)
        if move_tip and keys:
            self._clear_tip(session_id)
            displaced = self._tips.get(keys[-1])
            if displaced is not None:
                del self._tip_of[displaced]
            self._tips[keys[-1]] = session_id
            self._tip_of[session_id] = keys[-1]

    def forget(self, session_id: str) -> None:
        """Drop a session's tip (expired or closed); the keys it marked stay as history."""
        self._clear_tip(session_id)

    def tip_of(self, session_id: str) -> int | None:
        """The key where a session's latest request ended, or None."""
        return self._tip_of.get(session_id)

    def _clear_tip(self, session_id: str) -> None:
        key = self._tip_of.pop(session_id, None)
        if key is not None and self._tips.get(key) == session_id:
            del self._tips[key]
