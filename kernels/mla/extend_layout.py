"""Host-side layout of an absorbed-MLA extend batch and its tile plan (pure Python, no tensors).

An extend batch is B requests. Request b owns query rows q_indptr[b]:q_indptr[b+1] of the batch's queries, the
j-th of which sits at absolute position q_start[b] + j (its prefix length plus j), and key rows
kv_indptr[b]:kv_indptr[b+1] of the batch's key-row list, the i-th of which sits at absolute position
kv_offset + kv_stride * i. A query attends the keys of its own request at positions <= its own (lower-right
causal). kv_stride 1 and offset 0 are the plain layout; a DCP rank r of c holds every c-th token
(offset r, stride c).

The plan cuts the work into tiles (query rows [t0, t1) x key rows [k0, k1)) so that one tile's scores stay
under an element budget whatever the prefix length:
- a long request is split into query tiles and key tiles; a key tile wholly after a query tile's last
  position is skipped, and a tile wholly before its first position needs no mask;
- short requests are packed into shared tiles (block-diagonal mask), so a batch of many small requests costs a
  few large matmuls rather than one small one per request.
"""
from __future__ import annotations

from dataclasses import dataclass

# Scores of one tile stay under this many elements (fp32: 16 MiB).
DEFAULT_TILE_ELEMENTS = 1 << 22
DEFAULT_Q_TILE = 256


@dataclass(frozen=True)
class ExtendLayout:
    """Where each request's queries and keys are; see the module docstring."""

    q_indptr: tuple[int, ...]
    kv_indptr: tuple[int, ...]
    q_start: tuple[int, ...]
    kv_offset: int = 0
    kv_stride: int = 1

    def __post_init__(self) -> None:
        b = len(self.q_start)
        if len(self.q_indptr) != b + 1 or len(self.kv_indptr) != b + 1:
            raise ValueError(f"ExtendLayout: q_indptr ({len(self.q_indptr)}) and kv_indptr ({len(self.kv_indptr)}) "
                             f"need B+1 = {b + 1} entries for {b} requests")
        for name, ptr in (("q_indptr", self.q_indptr), ("kv_indptr", self.kv_indptr)):
            if ptr[0] != 0 or any(hi < lo for lo, hi in zip(ptr, ptr[1:])):
                raise ValueError(f"ExtendLayout: {name} must start at 0 and not decrease, got {ptr[:8]}...")
        if self.kv_stride < 1 or self.kv_offset < 0 or any(s < 0 for s in self.q_start):
            raise ValueError(f"ExtendLayout: kv_stride {self.kv_stride} must be >= 1, kv_offset {self.kv_offset} and "
                             "q_start >= 0")

    @classmethod
    def dense(cls, prefix_lens: list[int], extend_lens: list[int]) -> "ExtendLayout":
        """The plain single-rank layout: request b keys are its prefix_lens[b] + extend_lens[b] tokens in order."""
        q, kv = [0], [0]
        for p, n in zip(prefix_lens, extend_lens):
            q.append(q[-1] + n)
            kv.append(kv[-1] + p + n)
        return cls(tuple(q), tuple(kv), tuple(prefix_lens))

    @property
    def num_requests(self) -> int:
        return len(self.q_start)

    @property
    def num_queries(self) -> int:
        return self.q_indptr[-1]

    @property
    def num_keys(self) -> int:
        return self.kv_indptr[-1]

    def key_position(self, i: int) -> int:
        """Absolute position of a request's i-th key."""
        return self.kv_offset + self.kv_stride * i

    def keys_up_to(self, position: int) -> int:
        """How many of a request's keys sit at positions <= position."""
        if position < self.kv_offset:
            return 0
        return (position - self.kv_offset) // self.kv_stride + 1


@dataclass(frozen=True)
class Tile:
    """Query rows [t0, t1) against key rows [k0, k1); masked unless every pair is causal and same-request."""

    t0: int
    t1: int
    k0: int
    k1: int
    masked: bool


def key_tile(num_heads: int, q_tile: int = DEFAULT_Q_TILE, tile_elements: int = DEFAULT_TILE_ELEMENTS) -> int:
    """Keys per tile: q_tile * num_heads * k_tile <= tile_elements (at least 64)."""
    if num_heads < 1 or q_tile < 1:
        raise ValueError(f"plan_tiles: num_heads {num_heads} and q_tile {q_tile} must be >= 1")
    return max(64, tile_elements // (q_tile * num_heads))


def plan_tiles(layout: ExtendLayout, num_heads: int, q_tile: int = DEFAULT_Q_TILE,
               tile_elements: int = DEFAULT_TILE_ELEMENTS, exclude: frozenset[int] = frozenset()) -> list[Tile]:
    """Cut the batch into tiles of at most q_tile queries x k_tile keys (q_tile * heads * k_tile <= tile_elements).

    Requests in `exclude` get no tile (another path computes them). Tiles are ordered key-range-major, so
    consecutive tiles of a long request reuse one gathered key tile.
    """
    k_tile = key_tile(num_heads, q_tile, tile_elements)
    tiles: list[Tile] = []
    pack: list[int] = []

    def flush() -> None:
        if pack:
            lo, hi = pack[0], pack[-1]
            tiles.append(Tile(layout.q_indptr[lo], layout.q_indptr[hi + 1], layout.kv_indptr[lo],
                              layout.kv_indptr[hi + 1], True))
            pack.clear()

    for b in range(layout.num_requests):
        n = layout.q_indptr[b + 1] - layout.q_indptr[b]
        keys = layout.kv_indptr[b + 1] - layout.kv_indptr[b]
        if b in exclude:
            flush()
            continue
        if n == 0:
            continue
        if n > q_tile or keys > k_tile:
            flush()
            tiles += _long_request_tiles(layout, b, q_tile, k_tile)
            continue
        if pack:
            lo = pack[0]
            if (layout.q_indptr[b + 1] - layout.q_indptr[lo] > q_tile
                    or layout.kv_indptr[b + 1] - layout.kv_indptr[lo] > k_tile):
                flush()
        pack.append(b)
    flush()
    return tiles


def _long_request_tiles(layout: ExtendLayout, b: int, q_tile: int, k_tile: int) -> list[Tile]:
    q0, q1 = layout.q_indptr[b], layout.q_indptr[b + 1]
    kv0, keys = layout.kv_indptr[b], layout.kv_indptr[b + 1] - layout.kv_indptr[b]
    out: list[Tile] = []
    for k_lo in range(0, keys, k_tile):
        k_hi = min(keys, k_lo + k_tile)
        for t_lo in range(q0, q1, q_tile):
            t_hi = min(q1, t_lo + q_tile)
            first_pos = layout.q_start[b] + (t_lo - q0)
            last_pos = layout.q_start[b] + (t_hi - 1 - q0)
            visible = min(k_hi, layout.keys_up_to(last_pos))  # keys [k_lo, visible) can be seen by some query
            if visible <= k_lo:
                continue
            masked = layout.key_position(visible - 1) > first_pos
            out.append(Tile(t_lo, t_hi, kv0 + k_lo, kv0 + visible, masked))
    return out
