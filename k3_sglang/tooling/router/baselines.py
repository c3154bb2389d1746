"""Baseline placement policies for the replay, written from their published descriptions:

- `RoundRobin`: next worker in turn;
- `LeastLoad` (SMG `least_load`): argmin `(queued + inflight tokens) / throughput + λ k/(1-k)`,
  `k` = KV utilization, λ = 0.15 s; no cache knowledge;
- `CacheAware` (SMG `cache_aware`): if load is imbalanced (max - min > 64 and max > 1.5 min requests)
  take the least-loaded worker, else the longest predicted prefix match if its match rate > 0.3,
  else the worker with the smallest prefix tree. No admission control: every request is placed.
All share `LoadBook`, the router-side view of in-flight work. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k3_sglang.router.cost_model import kv_barrier_s
from k3_sglang.router.prefix import PrefixIndex


@dataclass(slots=True)
class BaselineTicket:
    """What a baseline remembers about one dispatched request."""

    worker: int
    prefill_tokens: int
    kv_tokens: int
    first_byte: bool = False


class LoadBook:
    """In-flight requests, prefill tokens and KV tokens per worker (the router's ledger)."""

    def __init__(self, workers: int) -> None:
        self.requests = [0] * workers
        self.prefill_tokens = [0] * workers
        self.kv_tokens = [0] * workers

    def open(self, worker: int, prefill_tokens: int, kv_tokens: int) -> BaselineTicket:
        """Credit a dispatch."""
        self.requests[worker] += 1
        self.prefill_tokens[worker] += prefill_tokens
        self.kv_tokens[worker] += kv_tokens
        return BaselineTicket(worker, prefill_tokens, kv_tokens)

    def first_byte(self, ticket: BaselineTicket) -> None:
        """Prefill done."""
        if not ticket.first_byte:
            ticket.first_byte = True
            self.prefill_tokens[ticket.worker] -= ticket.prefill_tokens

    def finish(self, ticket: BaselineTicket) -> None:
        """Request done."""
        self.first_byte(ticket)
        self.requests[ticket.worker] -= 1
        self.kv_tokens[ticket.worker] -= ticket.kv_tokens


class _Baseline:
    name = "baseline"

    def __init__(self, workers: int, kv_capacity: int, prefill_tps: float) -> None:
        self.workers, self.kv_capacity, self.prefill_tps = workers, kv_capacity, prefill_tps
        self.book = LoadBook(workers)

    def route(self, req, now: float):
        """Return (worker index, ticket) for a TraceRequest; baselines never reject."""
        worker = self.pick(req.input_length, req.full_blocks)
        return worker, self.book.open(worker, req.input_length, req.input_length + req.output_length)

    def pick(self, context: int, hashes: Sequence[int]) -> int:
        raise NotImplementedError

    def first_byte(self, ticket: BaselineTicket, now: float) -> None:
        """Forward to the ledger."""
        self.book.first_byte(ticket)

    def finish(self, ticket: BaselineTicket, now: float) -> None:
        """Forward to the ledger."""
        self.book.finish(ticket)


class RoundRobin(_Baseline):
    """Next worker in turn."""

    name = "round_robin"

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._next = 0

    def pick(self, context: int, hashes: Sequence[int]) -> int:
        worker = self._next % self.workers
        self._next += 1
        return worker


class LeastLoad(_Baseline):
    """SMG least_load: queued token work over throughput plus a KV-pressure barrier."""

    name = "least_load"
    kv_pressure_weight_s = 0.15

    def pick(self, context: int, hashes: Sequence[int]) -> int:
        book = self.book

        def score(w: int) -> float:
            k = min(book.kv_tokens[w] / self.kv_capacity, 0.999)
            return (book.prefill_tokens[w] + context) / self.prefill_tps + kv_barrier_s(k, self.kv_pressure_weight_s)

        return min(range(self.workers), key=score)


class CacheAware(_Baseline):
    """SMG cache_aware over an approximate per-worker prefix tree (block-hash index)."""

    name = "cache_aware"
    cache_threshold = 0.3
    balance_abs_threshold = 64
    balance_rel_threshold = 1.5

    def __init__(self, *args, tree_entries: int = 1 << 22) -> None:
        super().__init__(*args)
        self.tree = PrefixIndex(tree_entries)

    def pick(self, context: int, hashes: Sequence[int]) -> int:
        loads = self.book.requests
        low, high = min(loads), max(loads)
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            worker = loads.index(low)
        else:
            matched = self.tree.match(hashes, (1 << self.workers) - 1) if hashes else {}
            best = max(matched, key=matched.get, default=None)
            if best is not None and matched[best] / len(hashes) > self.cache_threshold:
                worker = best
            else:
                worker = min(range(self.workers), key=self.tree.blocks_of)
        self.tree.insert(hashes, worker)
        return worker


BASELINES = {cls.name: cls for cls in (RoundRobin, LeastLoad, CacheAware)}
