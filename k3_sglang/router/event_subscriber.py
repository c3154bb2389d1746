"""Subscribing to every worker's KV events (ZMQ, asyncio) and feeding `RouterCore.event_feed(worker)`.

Discovery: SGLang advertises its publisher under `kv_events` in `/server_info` (`endpoint_host` (a wildcard
means the worker URL's host), `endpoint_port_base`, `topic`, `replay_endpoint_port_base`, `dp_size`). A worker
that advertises nothing is asked again every `capacity_refresh_s` and meanwhile placed by text inference; so
is a data-parallel worker (one cache per DP rank: `dp_size` > 1), whose events this router does not use yet.
Per worker one task reads the SUB socket and hands each batch to the feed; when the feed reports a gap it asks
the replay socket (a DEALER on SGLang's ROUTER: `[b"", start_seq]`, answered by every buffered batch from it and
an end marker) while still reading live batches, which the feed buffers. No answer within
`event_replay_timeout_s` is a failed replay (the feed keeps only what follows the gap). Each kind of problem is
logged once per worker; counts are in `/metrics` and `GET /workers`. A worker that turns unhealthy has its feed
reset: after it comes back its cache is whatever the events then say. A worker whose publisher is `k3_zmq_curve`
(events off loopback, serving/kv_events_curve.py) is subscribed with CURVE (both sockets) when the router has keys
(event_curve.py), else placed by text inference.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from k3_sglang.router.capacity import get_json
from k3_sglang.router.event_curve import CURVE_PUBLISHER, client_socket_options, load_keys
from k3_sglang.router.config import MIXED
from k3_sglang.router.kv_events import END_OF_REPLAY, MalformedEvents, parse_seq

log = logging.getLogger("k3.router.events")
WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class EventSource:
    """Where a worker publishes: PUB endpoint, topic, and the replay endpoint (None: no replay)."""

    endpoint: str
    topic: str
    replay_endpoint: str | None
    curve: bool = False  # CURVE-protected (publisher `k3_zmq_curve`, event_curve.py)


def parse_event_source(worker_url: str, info) -> tuple[EventSource | None, str]:
    """(source, '') from a `/server_info` body, or (None, why not)."""
    desc = info.get("kv_events") if isinstance(info, dict) else None
    if not isinstance(desc, dict) or desc.get("publisher") not in ("zmq", CURVE_PUBLISHER):
        return None, "the worker advertises no KV events (/server_info kv_events)"
    if desc.get("dp_size", 1) != 1:
        return None, f"data-parallel worker (dp_size {desc.get('dp_size')}): one cache per rank, not used"
    port, replay = desc.get("endpoint_port_base"), desc.get("replay_endpoint_port_base")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None, f"bad endpoint_port_base {port!r}"
    host = desc.get("endpoint_host")
    host = urlsplit(worker_url).hostname or "127.0.0.1" if host in WILDCARD_HOSTS or host is None else str(host)
    address = f"[{host}]" if ":" in host and not host.startswith("[") else host
    topic = desc.get("topic") if isinstance(desc.get("topic"), str) else ""
    replay_ok = isinstance(replay, int) and not isinstance(replay, bool) and 0 < replay < 65536
    return EventSource(f"tcp://{address}:{port}", topic, f"tcp://{address}:{replay}" if replay_ok else None,
                       desc.get("publisher") == CURVE_PUBLISHER), ""


def curve_options(config) -> list | None:
    """The CURVE client options of a router config (`events_curve_key`), or None when it has no keys."""
    if config.events_curve_key is None:
        return None
    server = load_keys(config.events_curve_server_key, "events_curve_server_key")
    return client_socket_options(load_keys(config.events_curve_key, "events_curve_key"), server.public)


class WorkerSubscription:
    """Reads one worker's events into its feed until stopped."""

    def __init__(self, state, worker_id: str, source: EventSource, curve: list | None = None) -> None:
        self.state, self.worker_id, self.source = state, worker_id, source
        self.curve = curve if source.curve else None  # CURVE client options for both sockets
        self.feed = state.core.event_feed(worker_id)
        self.logged: set[str] = set()
        self.drop_next = 0  # tests: lose the next N live batches as if on the wire

    async def run(self, stop: asyncio.Event) -> None:
        context = zmq.asyncio.Context.instance()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.LINGER, 0)
        for option, value in self.curve or ():
            sub.setsockopt(option, value)
        sub.connect(self.source.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        log.info("worker %s: KV events from %s", self.worker_id, self.source.endpoint)
        was_healthy = True
        try:
            await asyncio.sleep(0.2)  # let the SUB connection settle so the live stream overlaps the replay
            start = self.feed.catch_up()
            if start is not None:
                await self._replay(context, sub, start)
                self._report()
            while not stop.is_set():
                worker = self.state.core.fleet.workers.get(self.worker_id)
                healthy = worker is not None and worker.healthy
                if was_healthy and not healthy:
                    self.feed.reset()
                if healthy and not was_healthy and self.feed.catch_up() is not None:
                    await self._replay(context, sub, 0)  # back up: its buffer holds what it did since
                was_healthy = healthy
                if not await sub.poll(200):
                    continue
                start = self._live(await sub.recv_multipart())
                if start is not None:
                    await self._replay(context, sub, start)
                self._report()
        finally:
            sub.close(0)

    def _live(self, frames: list[bytes]) -> int | None:
        try:
            if len(frames) != 3:
                raise MalformedEvents(f"{len(frames)} frames, expected (topic, seq, payload)")
            if self.drop_next > 0:
                self.drop_next -= 1
                return None
            return self.feed.on_live(parse_seq(frames[1]), frames[2])
        except MalformedEvents as exc:
            self.feed.counts["malformed"] += 1
            self.feed.problems.append(("malformed", str(exc)))
            return None

    async def _replay(self, context, sub, start: int) -> None:
        if self.source.replay_endpoint is None:
            self.feed.problems.append(("no_replay", "the worker has no replay endpoint"))
            self.feed.replay_failed()
            return
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        for option, value in self.curve or ():
            dealer.setsockopt(option, value)
        dealer.connect(self.source.replay_endpoint)
        batches: list[tuple[int, bytes]] = []
        deadline = asyncio.get_running_loop().time() + self.state.config.policy.event_replay_timeout_s
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
            poller = zmq.asyncio.Poller()
            poller.register(dealer, zmq.POLLIN)
            poller.register(sub, zmq.POLLIN)
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    self.feed.problems.append(("replay_timeout", f"no replay end from {self.source.replay_endpoint}"))
                    self.feed.replay_failed()
                    return
                ready = dict(await poller.poll(int(left * 1000) + 1))
                if sub in ready:
                    self._live(await sub.recv_multipart())  # buffered by the feed while it waits
                if dealer in ready:
                    frames = await dealer.recv_multipart()
                    seq = parse_seq(frames[2]) if len(frames) == 4 else None
                    if seq is None:
                        continue
                    if seq == END_OF_REPLAY:
                        self.feed.on_replay(batches)
                        return
                    batches.append((seq, frames[3]))
        except MalformedEvents as exc:
            self.feed.problems.append(("replay_malformed", str(exc)))
            self.feed.replay_failed()
        finally:
            dealer.close(0)

    def _report(self) -> None:
        for kind, detail in self.feed.take_problems():
            if kind not in self.logged:
                self.logged.add(kind)
                log.warning("worker %s KV events: %s (%s); further ones are counted, not logged", self.worker_id,
                            kind, detail)


async def events_loop(state, stop: asyncio.Event) -> None:
    """Keep one subscription per worker that advertises events, until stopped."""
    tasks: dict[str, asyncio.Task] = {}
    next_try: dict[str, float] = {}
    logged: set[tuple[str, str]] = set()
    reliability = state.config.reliability
    curve = curve_options(state.config)
    try:
        while not stop.is_set():
            workers = {w.worker_id for w in state.core.fleet.workers.values() if w.role == MIXED}
            for worker_id in [w for w in tasks if w not in workers or tasks[w].done()]:
                task = tasks.pop(worker_id)
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.error("worker %s: KV-event subscription failed (%r); resubscribing", worker_id,
                              task.exception())
                task.cancel()
                state.subscriptions.pop(worker_id, None)
            for worker_id in workers - set(tasks):
                if next_try.get(worker_id, 0.0) > state.now():
                    continue
                _, info = await get_json(state.control, worker_id + "/server_info", reliability.health_timeout_s)
                source, why = parse_event_source(worker_id, info)
                if source is not None and source.curve and curve is None:
                    source, why = None, "its KV events are CURVE-protected and this router has no keys for them " \
                                        "(--curve-key, --curve-server-key)"
                if source is None:
                    next_try[worker_id] = state.now() + reliability.capacity_refresh_s
                    if info is not None and (worker_id, why) not in logged:
                        logged.add((worker_id, why))
                        log.info("worker %s: placed by text inference (%s)", worker_id, why)
                    continue
                subscription = state.subscriptions[worker_id] = WorkerSubscription(state, worker_id, source, curve)
                tasks[worker_id] = asyncio.create_task(subscription.run(stop))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(2.0, reliability.health_interval_s))
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
