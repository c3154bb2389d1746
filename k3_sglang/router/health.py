"""Active health probes with consecutive failure/success thresholds.

The probe is `GET /v1/loads` by default: SGLang answers it from shared memory without running a
generation, so a worker deep in a 100K-token prefill is not marked dead (SGLang's `/health_generate`
runs a 1-token generate and times out behind long prefills). A worker whose probe path answers 404
is probed on `/health` instead. A successful `/v1/loads` probe also refreshes the worker's reported
queue (`num_waiting_uncached_tokens`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx

from k3_sglang.router.capacity import parse_loads
from k3_sglang.router.config import ReliabilityConfig
from k3_sglang.router.fleet import WorkerState

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


async def probe(client: httpx.AsyncClient, worker: WorkerState, counter: HealthCounter,
                cfg: ReliabilityConfig) -> bool:
    """Probe one worker once; update its health and reported queue. Returns the probe result."""
    path = counter.probe_path or cfg.health_path
    ok = False
    try:
        response = await client.get(worker.worker_id + path, timeout=cfg.health_timeout_s)
        if response.status_code == 404 and path != "/health":
            counter.probe_path = "/health"
            response = await client.get(worker.worker_id + "/health", timeout=cfg.health_timeout_s)
        ok = response.status_code == 200
        if ok and path == "/v1/loads":
            reported = parse_loads(response.json())
            worker.reported_waiting_tokens = reported.waiting_uncached_tokens or 0
    except (httpx.HTTPError, OSError, ValueError):
        ok = False
    was = worker.healthy
    worker.healthy = counter.observe(ok)
    if was != worker.healthy:
        log.warning("worker %s is now %s", worker.worker_id, "healthy" if worker.healthy else "unhealthy")
    return ok


async def health_loop(client: httpx.AsyncClient, workers: dict[str, WorkerState],
                      counters: dict[str, HealthCounter], cfg: ReliabilityConfig,
                      stop: asyncio.Event) -> None:
    """Probe every worker each `health_interval_s` until `stop` is set."""
    while not stop.is_set():
        current = [(w, counters[w.worker_id]) for w in list(workers.values()) if w.worker_id in counters]
        await asyncio.gather(*(probe(client, w, c, cfg) for w, c in current))
        try:
            await asyncio.wait_for(stop.wait(), timeout=cfg.health_interval_s)
        except asyncio.TimeoutError:
            pass
