"""A brute-force model of a hybrid worker's radix cache that publishes KV events, for the event-index tests.

Blocks of `page` tokens form a trie; each block has random 64-bit hash, a set of tiers, and optionally a
KDA checkpoint (its own tiers and the sessions that stored it). Every operation returns the raw event maps
SGLang (and our plugin) would publish; `resumable` / `session_resumable` answer the same questions as the
router's index, by walking the trie.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from k3_sglang.router.event_index import Resumable
from k3_sglang.router.kv_events import KDA_REMOVED, KDA_STORED, TIERS

GPU, CPU = "GPU", "CPU_PINNED"


@dataclass
class SimBlock:
    parent: int | None
    page: tuple
    depth: int
    tiers: set = field(default_factory=set)
    children: dict = field(default_factory=dict)  # page -> hash
    checkpoint: set = field(default_factory=set)  # tiers holding a KDA state at this block's end
    sessions: set = field(default_factory=set)


class SimRadixWorker:
    """The ground truth: what the worker holds."""

    def __init__(self, rng: random.Random, page: int = 2) -> None:
        self.rng, self.page = rng, page
        self.blocks: dict[int, SimBlock] = {}
        self.roots: dict[tuple, int] = {}

    # ---- operations (each returns the events it publishes) ---------------------------------
    def insert(self, tokens: list[int], session: str | None, checkpoint: bool = True, tier: str = GPU) -> list[dict]:
        events, parent, run = [], None, None
        full = len(tokens) // self.page
        for i in range(full):
            page = tuple(tokens[i * self.page:(i + 1) * self.page])
            siblings = self.roots if parent is None else self.blocks[parent].children
            h = siblings.get(page)
            if h is None or tier not in self.blocks[h].tiers:
                if h is None:
                    h = self.rng.getrandbits(63) - (1 << 62)
                    siblings[page] = h
                    depth = (i + 1) * self.page
                    self.blocks[h] = SimBlock(parent, page, depth)
                self.blocks[h].tiers.add(tier)
                if run is None or run["medium"] != tier:
                    run = {"type": "BlockStored", "block_hashes": [], "parent_block_hash": parent, "token_ids": [],
                           "block_size": self.page, "lora_id": None, "medium": tier}
                    if session is not None:
                        run["session_id"] = session
                    events.append(run)
                run["block_hashes"].append(h)
                run["token_ids"].extend(page)
            else:
                run = None
            parent = h
        if checkpoint and parent is not None:
            block = self.blocks[parent]
            if not block.checkpoint:
                block.sessions = set()
            block.checkpoint.add(tier)
            if session is not None:
                block.sessions.add(session)
            event = {"type": KDA_STORED, "block_hash": parent, "tokens": block.depth, "medium": tier}
            if session is not None:
                event["session_id"] = session
            events.append(event)
        return events

    def leaves(self) -> list[int]:
        return [h for h, b in self.blocks.items() if not b.children]

    def evict_leaf(self, h: int, tier: str | None = None) -> list[dict]:
        """Drop a leaf from one tier (None: every tier); with it goes its checkpoint in that tier."""
        block = self.blocks[h]
        tiers = set(block.tiers) if tier is None else {tier} & block.tiers
        events = []
        for t in sorted(tiers):
            block.tiers.discard(t)
            events.append({"type": "BlockRemoved", "block_hashes": [h], "medium": t})
            if t in block.checkpoint:
                block.checkpoint.discard(t)
                if self.rng.random() < 0.5:  # the plugin reports it too; the index must not need it
                    events.append({"type": KDA_REMOVED, "block_hash": h, "medium": t})
        if not block.tiers:
            siblings = self.roots if block.parent is None else self.blocks[block.parent].children
            del siblings[block.page]
            del self.blocks[h]
        return events

    def drop_checkpoint(self, h: int, tier: str) -> list[dict]:
        block = self.blocks[h]
        block.checkpoint.discard(tier)
        return [{"type": KDA_REMOVED, "block_hash": h, "medium": tier}]

    def clear(self) -> list[dict]:
        self.blocks.clear()
        self.roots.clear()
        return [{"type": "AllBlocksCleared"}]

    # ---- truth -------------------------------------------------------------------------------
    def resumable(self, tokens: list[int]) -> Resumable:
        best, device_best, on_device, parent = 0, 0, True, None
        for i in range(len(tokens) // self.page):
            siblings = self.roots if parent is None else self.blocks[parent].children
            h = siblings.get(tuple(tokens[i * self.page:(i + 1) * self.page]))
            if h is None:
                break
            block = self.blocks[h]
            on_device = on_device and GPU in block.tiers
            if block.checkpoint:
                best = block.depth
                if on_device and GPU in block.checkpoint:
                    device_best = best
            parent = h
        return Resumable(best, device_best)

    def session_resumable(self, session: str) -> Resumable:
        best = Resumable()
        for block in self.blocks.values():
            if block.checkpoint and session in block.sessions:
                device = block.depth if GPU in block.checkpoint and GPU in block.tiers else 0
                best = best.better(Resumable(block.depth, device))
        return best


def random_operation(worker: SimRadixWorker, rng: random.Random, paths: list[list[int]],
                     sessions: list[str]) -> list[dict]:
    """One random store / evict / demote / checkpoint drop / (rare) clear on `worker`."""
    roll = rng.random()
    if roll < 0.45 or not worker.blocks:
        if paths and rng.random() < 0.6:  # extend or re-insert a known path (shared prefixes, turns)
            base = rng.choice(paths)
            tokens = base[: rng.randint(1, len(base))] + [rng.randrange(6) for _ in range(rng.randint(0, 9))]
        else:
            tokens = [rng.randrange(6) for _ in range(rng.randint(1, 14))]
        paths.append(tokens)
        tier = GPU if rng.random() < 0.85 else CPU
        return worker.insert(tokens, rng.choice(sessions + [None]), checkpoint=rng.random() < 0.8, tier=tier)
    if roll < 0.75:
        leaf = rng.choice(worker.leaves())
        return worker.evict_leaf(leaf, rng.choice([None, GPU, CPU]))
    if roll < 0.97:
        held = [(h, t) for h, b in worker.blocks.items() for t in b.checkpoint]
        if held:
            return worker.drop_checkpoint(*rng.choice(held))
        return []
    return worker.clear()


def tier_bit(name: str) -> int:
    return TIERS[name]
