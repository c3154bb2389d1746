"""Trace replay with the requests split across router replicas (issue 41): placement quality of N replicas vs one.

`ReplicatedPolicy` runs `replicas` independent `RouterCore`s (each its own ledger, session index, prefix index and
learned rates, as separate processes would) over one simulated fleet whose workers publish KV events to every
replica (`FanoutFeed`), as each replica subscribes to every worker. Request i goes to replica `i % replicas` (a
round-robin load balancer: the worst case for a replica's local state, since a session's consecutive turns always
alternate). With `session_ids`, each request carries its trace session's label as an explicit session id (as an
agent sending `X-Session-Id` would); without, sessions are keyless and identified per replica.
"""

from __future__ import annotations

import dataclasses

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.event_feed import WorkerEventFeed
from k3_sglang.router.event_index import WorkerEventIndex
from k3_sglang.tooling.router.replay_events import EventArm, EventFedPolicy, EventSimEngine
from k3_sglang.tooling.router.replay_sim import BLOCK_TOKENS, FleetSpec, ReplayResult, TraceRequest, label_sessions, simulate


class FanoutFeed:
    """One worker's event stream delivered to every replica's feed (its `index` is the first replica's)."""

    def __init__(self, feeds: list[WorkerEventFeed]) -> None:
        self.feeds = feeds

    @property
    def index(self) -> WorkerEventIndex:
        return self.feeds[0].index

    @property
    def state(self) -> str:
        return self.feeds[0].state

    def on_live(self, seq: int, payload: bytes) -> None:
        for feed in self.feeds:
            feed.on_live(seq, payload)


class ReplicatedPolicy:
    """`replicas` copies of our event-fed policy behind a round-robin balancer, fed by the same workers."""

    def __init__(self, spec: FleetSpec, policy: PolicyConfig, replicas: int = 2, session_ids: bool = False,
                 arm: EventArm | None = None) -> None:
        arm = arm or EventArm("k3_events")
        self.replicas = [EventFedPolicy(spec, policy, arm) for _ in range(replicas)]
        self.name = f"{arm.name}_x{replicas}" + ("_ids" if session_ids else "")
        self.session_ids = session_ids
        self.labels: dict[int, str] = {}
        self.owner: dict[int, EventFedPolicy] = {}  # id(ticket) -> the replica that placed it
        self.count = 0

    def make_engine(self, i: int) -> EventSimEngine:
        """Simulated worker `i`, publishing to every replica's feed of it."""
        feeds = []
        for replica in self.replicas:
            feed = replica.core.event_feed(replica.ids[i])
            feed.index = WorkerEventIndex(feed.index.max_blocks, unit_tokens=BLOCK_TOKENS)
            feeds.append(feed)
        engine = EventSimEngine(self.replicas[0].spec, feed=FanoutFeed(feeds), arm=self.replicas[0].arm)
        for replica in self.replicas:
            replica.engines[i] = engine
        return engine

    def route(self, req: TraceRequest, now: float):
        replica = self.replicas[self.count % len(self.replicas)]
        if self.session_ids:
            req = dataclasses.replace(req, session_id=self.labels[self.count])
        self.count += 1
        worker, ticket = replica.route(req, now)
        if ticket is not None:
            self.owner[id(ticket)] = replica
        return worker, ticket

    def first_byte(self, ticket, now: float) -> None:
        self.owner[id(ticket)].first_byte(ticket, now)

    def finish(self, ticket, now: float) -> None:
        self.owner.pop(id(ticket)).finish(ticket, now)


def run_replica_replay(trace: list[TraceRequest], spec: FleetSpec, policy: PolicyConfig,
                       replicas: int) -> tuple[list[dict], dict[str, list[float]]]:
    """Rows (and TTFT samples) of `k3 router replay --replicas N`: one replica vs N, with keyless sessions under
    `policy`, then with named sessions and `session_home: rendezvous`."""
    from k3_sglang.tooling.router.replay import summarize

    rows, samples = [], {}
    named = dataclasses.replace(policy, session_home="rendezvous")
    for cfg, ids in ((policy, False), (named, True)):
        for n in (1, replicas):
            result = simulate_replicas(trace, spec, cfg, n, ids)
            result.policy += "_rendezvous" if ids else ""
            rows.append(summarize(result))
            samples[result.policy] = result.ttfts
    return rows, samples


def simulate_replicas(trace: list[TraceRequest], spec: FleetSpec, policy: PolicyConfig, replicas: int,
                      session_ids: bool = False) -> ReplayResult:
    """Replay `trace` with its requests split round-robin across `replicas` router replicas."""
    labels = label_sessions(trace)
    chosen = ReplicatedPolicy(spec, policy, replicas, session_ids)
    chosen.labels = dict(enumerate(labels))
    return simulate(trace, spec, chosen, labels)
