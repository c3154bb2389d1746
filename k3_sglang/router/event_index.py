"""One worker's cache as its KV events describe it: blocks, KDA checkpoints and the sessions that made them.

Pure; fed by `WorkerEventFeed` (event_feed.py). What a query answers:
- `match_tokens(ids)`: how far a token sequence is *resumable* on this worker: the deepest KDA checkpoint on
  the longest run of leading blocks the worker holds (a hybrid KDA/MLA model can only resume where a
  recurrent state was saved, not just where KV blocks exist), both over every tier and over the device tier
  alone (the rest must first be loaded from host or L3);
- `session_resumable(sid)`: the same for the deepest checkpoint a session's requests stored (events carry the
  `session_id` the request was sent with), for requests the router has no token ids for (chat text).
Blocks are identified by the worker's own hashes; to match a request's token ids the index also keys each
block by a router-side chain over its tokens (`chain_key`), since the worker publishes each block's tokens.
A block that is present implies its ancestors are (the radix tree evicts leaves first), so a walk stops at
the first missing block. The index is bounded (`max_blocks`); past the bound it empties itself and reports
`overflowed`, and the feed treats it as having lost events. `unit_tokens`: the tokens one published token id
stands for (1 for SGLang; the trace replay publishes one id per 512-token block), applied to every answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k3_sglang.router.kv_events import (
    DEVICE, AllCleared, BlocksRemoved, BlocksStored, CheckpointRemoved, CheckpointStored, Event,
)

ROOT_CHAIN = 0x5EED_CAFE_F00D


def chain_key(parent_chain: int, page: tuple) -> int:
    """Router-side key of a block: its tokens chained on its parent's key (the same for requests and events)."""
    return hash((parent_chain, page))


@dataclass(slots=True)
class Block:
    """One published block: parent hash, tokens from the root to its end (-1: unknown), chain key, tiers, and
    its own token ids (to name a prefix to the worker, e.g. for a prefetch)."""

    parent: int | None
    depth: int
    chain: int | None
    tiers: int
    page: tuple = ()


@dataclass(frozen=True, slots=True)
class Resumable:
    """Resumable prefix length in tokens: over all tiers, and on the device tier alone."""

    tokens: int = 0
    device_tokens: int = 0

    def better(self, other: "Resumable") -> "Resumable":
        return Resumable(max(self.tokens, other.tokens), max(self.device_tokens, other.device_tokens))


NOTHING = Resumable()


class WorkerEventIndex:
    """Blocks and KDA checkpoints one worker holds, per its events."""

    def __init__(self, max_blocks: int = 4_000_000, unit_tokens: int = 1) -> None:
        self.max_blocks = max(1, int(max_blocks))
        self.unit_tokens = unit_tokens
        self.blocks: dict[int, Block] = {}
        self.by_chain: dict[int, int] = {}
        self.checkpoints: dict[int, tuple[int, int]] = {}  # block hash -> (tokens, tiers)
        self.owners: dict[int, set[str]] = {}              # checkpoint hash -> sessions that stored it
        self.session_checkpoints: dict[str, set[int]] = {}
        self.block_size: int | None = None
        self.overflowed = False
        self.orphans = 0  # stores whose parent the index did not know
        self.device_blocks = 0  # blocks held in the device tier (what the worker's KV pool holds)
        self.device_states = 0  # KDA checkpoints held in the device tier (state slots the radix cache holds)

    def __len__(self) -> int:
        return len(self.blocks)

    def clear(self) -> None:
        """Forget everything (AllBlocksCleared, a restart, or a resync that could not replay)."""
        self.blocks.clear()
        self.by_chain.clear()
        self.checkpoints.clear()
        self.owners.clear()
        self.session_checkpoints.clear()
        self.device_blocks = self.device_states = 0

    @property
    def resident_tokens(self) -> int:
        """KV tokens the worker holds on its device tier, by its events (the ledger's `resident_tokens` where it
        publishes)."""
        return self.device_blocks * (self.block_size or 0) * self.unit_tokens

    # ---- events --------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Apply one event in stream order."""
        if isinstance(event, BlocksStored):
            self._store(event)
        elif isinstance(event, BlocksRemoved):
            for h in event.block_hashes:
                self._remove_block(h, event.tier)
        elif isinstance(event, CheckpointStored):
            tokens, tiers = self.checkpoints.get(event.block_hash, (event.tokens, 0))
            self.checkpoints[event.block_hash] = (event.tokens, tiers | event.tier)
            self.device_states += bool(event.tier & DEVICE and not tiers & DEVICE)
            if event.session_id is not None:
                self.owners.setdefault(event.block_hash, set()).add(event.session_id)
                self.session_checkpoints.setdefault(event.session_id, set()).add(event.block_hash)
        elif isinstance(event, CheckpointRemoved):
            self._remove_checkpoint(event.block_hash, event.tier)
        elif isinstance(event, AllCleared):
            self.clear()

    def _store(self, event: BlocksStored) -> None:
        self.block_size = self.block_size or event.block_size
        parent = self.blocks.get(event.parent) if event.parent is not None else None
        if event.parent is not None and parent is None:
            self.orphans += 1
        depth = 0 if event.parent is None else (parent.depth if parent is not None else -1)
        chain = ROOT_CHAIN if event.parent is None else (parent.chain if parent is not None else None)
        parent_hash, size = event.parent, event.block_size
        for i, h in enumerate(event.block_hashes):
            depth = depth + size if depth >= 0 else -1
            chain = chain_key(chain, event.token_ids[i * size:(i + 1) * size]) if chain is not None else None
            block = self.blocks.get(h)
            if block is None:
                self.blocks[h] = Block(parent_hash, depth, chain, event.tier, event.token_ids[i * size:(i + 1) * size])
                self.device_blocks += bool(event.tier & DEVICE)
                if chain is not None:
                    self.by_chain[chain] = h
            else:
                self.device_blocks += bool(event.tier & DEVICE and not block.tiers & DEVICE)
                block.tiers |= event.tier
            parent_hash = h
        if len(self.blocks) > self.max_blocks:
            self.clear()
            self.overflowed = True

    def _remove_block(self, h: int, tier: int) -> None:
        block = self.blocks.get(h)
        if block is None:
            return
        self.device_blocks -= bool(block.tiers & DEVICE and tier & DEVICE)
        block.tiers &= ~tier
        self._remove_checkpoint(h, tier if block.tiers else -1)  # a state without its KV block resumes nothing
        if block.tiers:
            return
        del self.blocks[h]
        if block.chain is not None and self.by_chain.get(block.chain) == h:
            del self.by_chain[block.chain]

    def _remove_checkpoint(self, h: int, tier: int) -> None:
        entry = self.checkpoints.get(h)
        if entry is None:
            return
        tiers = entry[1] & ~tier
        self.device_states -= bool(entry[1] & DEVICE and not tiers & DEVICE)
        if tiers:
            self.checkpoints[h] = (entry[0], tiers)
            return
        del self.checkpoints[h]
        for session in self.owners.pop(h, ()):
            held = self.session_checkpoints.get(session)
            if held is not None:
                held.discard(h)
                if not held:
                    del self.session_checkpoints[session]

    # ---- queries -------------------------------------------------------------------------
    def match_tokens(self, token_ids: Sequence[int], limit: int | None = None) -> Resumable:
        """Resumable prefix of `token_ids[:limit]` on this worker (0 when the block size is not known yet)."""
        size = self.block_size
        if not size or not self.checkpoints:
            return NOTHING
        chain, best, device_best, on_device = ROOT_CHAIN, 0, 0, True
        by_chain, blocks, checkpoints = self.by_chain, self.blocks, self.checkpoints
        end = len(token_ids) if limit is None else min(limit, len(token_ids))
        for start in range(0, end - size + 1, size):
            chain = chain_key(chain, tuple(token_ids[start:start + size]))
            h = by_chain.get(chain)
            if h is None:
                break
            on_device = on_device and bool(blocks[h].tiers & DEVICE)
            entry = checkpoints.get(h)
            if entry is not None:
                best = start + size
                if on_device and entry[1] & DEVICE:
                    device_best = best
        return Resumable(best * self.unit_tokens, device_best * self.unit_tokens)

    def prefix_tokens(self, block_hash: int) -> list | None:
        """The token ids from the root to the end of `block_hash`, or None when a block on the way is unknown."""
        pages = []
        h: int | None = block_hash
        while h is not None:
            block = self.blocks.get(h)
            if block is None:
                return None
            pages.append(block.page)
            h = block.parent
        return [token for page in reversed(pages) for token in page]

    def session_checkpoint(self, session_id: str) -> int | None:
        """The hash of the deepest resumable checkpoint `session_id` stored (any tier), or None."""
        best, best_tokens = None, 0
        for h in self.session_checkpoints.get(session_id, ()):
            tokens = self.checkpoints[h][0]
            if h in self.blocks and tokens > best_tokens:
                best, best_tokens = h, tokens
        return best

    def session_resumable(self, session_id: str) -> Resumable:
        """The deepest resumable checkpoint stored by `session_id`'s requests on this worker."""
        best = NOTHING
        for h in self.session_checkpoints.get(session_id, ()):
            tokens, tiers = self.checkpoints[h]
            block = self.blocks.get(h)
            if block is None:
                continue
            device = tokens if tiers & DEVICE and block.tiers & DEVICE else 0
            best = best.better(Resumable(tokens * self.unit_tokens, device * self.unit_tokens))
        return best
