"""Active health probes with consecutive failure/success thresholds, and the load they report.

The probe is `GET /v1/loads` by default: SGLang answers it from shared memory without running a
generation, so a worker deep in a 100K-token prefill is not marked dead (SGLang's `/health_generate`
runs a 1-token generate and times out behind long prefills). A worker whose probe path answers 404
is probed on `/health` instead. A successful `/v1/loads` probe refreshes the worker's reported
queue (waiting uncached tokens, waiting and running requests), and every probe result goes to the
worker's circuit breaker, so a half-open worker that gets no traffic still closes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

from k3_sglang.router.capacity import get_json, parse_loads
from k3_sglang.router.config import ReliabilityConfig
from k3_sglang.router.core import RouterCore

log = logging.getLogger("k3.router.health")


@dataclass(slots=True)
class HealthCounter:
    """Consecutive probe results for one worker; flips `healthy` only at the thresholds."""

    fail_threshold: int
    success_threshold: int
    healthy: bool = True
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    probe_path: str | None = None

    def observe(self, ok: bool) -> bool:
        """Record one probe result and return the (possibly changed) health."""
        if ok:
            self.consecutive_failures = 0
            self.consecutive_successes += 1
            if not self.healthy and self.consecutive_successes >= self.success_threshold:
                self.healthy = True
        else:
            self.consecutive_successes = 0
            self.consecutive_failures += 1
            if self.healthy and self.consecutive_failures >= self.fail_threshold:
                self.healthy = False
        return self.healthy


async def probe(session: aiohttp.ClientSession, core: RouterCore, worker_id: str, counter: HealthCounter,
                cfg: ReliabilityConfig, now: float) -> bool:
    """Probe one worker once; update its health, reported load and breaker. Returns the probe result."""
    path = counter.probe_path or cfg.health_path
    status, payload = await get_json(session, worker_id + path, cfg.health_timeout_s)
    if status == 404 and path != "/health":
        counter.probe_path = path = "/health"
        status, payload = await get_json(session, worker_id + path, cfg.health_timeout_s)
    worker = core.fleet.workers.get(worker_id)
    if worker is None:  # removed while probing
        return False
    ok = status == 200
    if ok and path.startswith("/v1/loads"):
        reported = parse_loads(payload)
        worker.reported_waiting_tokens = reported.waiting_uncached_tokens or 0
        worker.reported_waiting_requests = reported.waiting_requests or 0
        worker.reported_running_requests = reported.running_requests or 0
    was = worker.healthy
    worker.healthy = counter.observe(ok)
    core.breakers[worker_id].record_probe(ok, now)
    if was != worker.healthy:
        log.warning("worker %s is now %s", worker_id, "healthy" if worker.healthy else "unhealthy")
    return ok


async def health_loop(session: aiohttp.ClientSession, core: RouterCore, counters: dict[str, HealthCounter],
                      cfg: ReliabilityConfig, clock, stop: asyncio.Event) -> None:
    """Probe every worker each `health_interval_s` until `stop` is set (`clock()`: monotonic now)."""
    while not stop.is_set():
        current = list(counters.items())
        await asyncio.gather(*(probe(session, core, worker_id, counter, cfg, clock())
                               for worker_id, counter in current))
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.health_interval_s)
        except asyncio.TimeoutError:
            pass
