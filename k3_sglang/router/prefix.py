"""Prefix awareness: chained block hashes and a bounded LRU index of which worker saw which block.

Block `i`'s hash covers blocks `0..i` (it is chained on the previous hash), so a hit on block `i`
for a worker means that worker saw the whole prefix up to `i`. Only full blocks are hashed.
The index is *predicted on route*: the router inserts a prefix for the worker it sends it to.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

_SEED = 0x9E3779B97F4A7C15


def text_block_hashes(text: str | bytes, block_chars: int, limit: int | None = None) -> list[int]:
    """Chained 64-bit hashes of each full `block_chars`-sized block of `text` (UTF-8 bytes)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    count = len(data) // block_chars
    if limit is not None:
        count = min(count, limit)
    hashes: list[int] = []
    prev = _SEED.to_bytes(8, "little")
    for i in range(count):
        digest = hashlib.blake2b(data[i * block_chars:(i + 1) * block_chars], digest_size=8, key=prev).digest()
        hashes.append(int.from_bytes(digest, "little"))
        prev = digest
    return hashes


def text_prefix_key(data: bytes, block_hashes: Sequence[int], end: int, block_chars: int) -> int:
    """A key naming exactly `data[:end]`: the block hash when `end` is block-aligned, else the
    chain up to the last full block extended by the remaining bytes."""
    full = end // block_chars
    if full and end == full * block_chars:
        return block_hashes[full - 1]
    chain = block_hashes[full - 1].to_bytes(8, "little") if full else _SEED.to_bytes(8, "little")
    tail = hashlib.blake2b(data[full * block_chars:end], digest_size=8, key=chain, person=b"k3-tail")
    return int.from_bytes(tail.digest(), "little")


def token_prefix_key(token_ids: Sequence[int]) -> int:
    """A key naming exactly a (short) token sequence."""
    return hash((_SEED, "tail", tuple(token_ids)))


def token_block_hashes(token_ids: Sequence[int], block_tokens: int, limit: int | None = None) -> list[int]:
    """Chained hashes of each full `block_tokens`-sized block of token ids."""
    count = len(token_ids) // block_tokens
    if limit is not None:
        count = min(count, limit)
    hashes: list[int] = []
    prev = _SEED
    for i in range(count):
        prev = hash((prev, tuple(token_ids[i * block_tokens:(i + 1) * block_tokens])))
        hashes.append(prev)
    return hashes


def iter_bits(mask: int) -> Iterable[int]:
    """Yield the positions of the set bits of `mask`."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class PrefixIndex:
    """block hash -> bitmask of workers (by bit index), bounded, least recently used evicted first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max(1, int(max_entries))
        self._owners: OrderedDict[int, int] = OrderedDict()
        self._blocks_per_bit: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def blocks_of(self, bit: int) -> int:
        """How many indexed blocks list worker `bit` (an SMG-style 'tree size')."""
        return self._blocks_per_bit.get(bit, 0)

    def match(self, hashes: Sequence[int], candidate_mask: int) -> dict[int, int]:
        """Leading matched blocks per worker bit in `candidate_mask` (bits with 0 are omitted)."""
        matched: dict[int, int] = {}
        alive = candidate_mask
        owners = self._owners
        for i, h in enumerate(hashes):
            still = alive & owners.get(h, 0)
            if still != alive:
                for bit in iter_bits(alive & ~still):
                    if i:
                        matched[bit] = i
                alive = still
                if not alive:
                    return matched
        for bit in iter_bits(alive):
            if hashes:
                matched[bit] = len(hashes)
        return matched

    def insert(self, hashes: Iterable[int], bit: int) -> None:
        """Record that worker `bit` holds these blocks, refreshing their recency."""
        flag = 1 << bit
        owners = self._owners
        for h in hashes:
            mask = owners.pop(h, 0)
            if not mask & flag:
                self._blocks_per_bit[bit] = self._blocks_per_bit.get(bit, 0) + 1
            owners[h] = mask | flag
        while len(owners) > self.max_entries:
            _, mask = owners.popitem(last=False)
            self._uncount(mask)

    def forget_worker(self, bit: int) -> None:
        """Drop worker `bit` from every entry (used when a worker is removed)."""
        flag = 1 << bit
        for h in [h for h, m in self._owners.items() if m & flag]:
            rest = self._owners[h] & ~flag
            if rest:
                self._owners[h] = rest
            else:
                del self._owners[h]
        self._blocks_per_bit.pop(bit, None)

    def _uncount(self, mask: int) -> None:
        for bit in iter_bits(mask):
            self._blocks_per_bit[bit] -= 1
