"""Fixtures: mock SGLang workers and a router, all on 127.0.0.1 in background threads."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest

from k3_sglang.router.app import create_app, router_state
from k3_sglang.router.config import PolicyConfig, ReliabilityConfig, RouterConfig, WorkerSpec
from k3_sglang.tooling.router.mock_worker import MockState, create_mock_app
from k3_sglang.router.threaded import ServerThread

FAST_RELIABILITY = ReliabilityConfig(
    health_interval_s=0.2, health_timeout_s=1.0, health_fail_threshold=2, health_success_threshold=1,
    breaker_failure_threshold=3, breaker_success_threshold=1, breaker_open_s=0.5,
    connect_timeout_s=1.0, read_timeout_s=2.0, write_timeout_s=2.0, pool_timeout_s=2.0,
    max_retries=2, retry_backoff_s=0.01,
)


@dataclasses.dataclass
class Fleet:
    """Running mock workers and the router in front of them."""

    workers: list[ServerThread]
    states: list[MockState]
    router: ServerThread
    app: object

    @property
    def state(self):
        return router_state(self.app)

    @property
    def core(self):
        return self.state.core

    def worker_index(self, url: str) -> int:
        return [w.url for w in self.workers].index(url)

    def set_fault(self, index: int, **fault) -> None:
        httpx.post(self.workers[index].url + "/_fault", json=fault, timeout=5).raise_for_status()

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Wait until every ticket is closed (streams finish asynchronously)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(w.inflight_requests == 0 for w in self.core.fleet.workers.values()):
                return
            time.sleep(0.02)


@dataclasses.dataclass
class PDFleet:
    """Mock PD prefill and decode servers and the router pairing them."""

    prefills: list[ServerThread]
    decodes: list[ServerThread]
    prefill_states: list[MockState]
    decode_states: list[MockState]
    router: ServerThread
    app: object

    @property
    def state(self):
        return router_state(self.app)

    @property
    def core(self):
        return self.state.core

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until every ticket of both legs is closed; True when they are."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(w.inflight_requests == 0 and w.active_tokens == 0 for w in self.core.fleet.workers.values()):
                return True
            time.sleep(0.02)
        return False


@pytest.fixture
def make_pd_fleet():
    """Factory: `make_pd_fleet(prefills=1, decodes=2, prefill={MockState kwargs}, decode={...})` -> PDFleet."""
    started: list[ServerThread] = []

    def factory(prefills: int = 1, decodes: int = 1, prefill: dict | None = None, decode: dict | None = None,
                specs=None, policy: PolicyConfig | None = None, reliability: ReliabilityConfig | None = None,
                **router_kwargs) -> PDFleet:
        p_states = [MockState(name=f"p{i}", disaggregation_mode="prefill", bootstrap_port=20000 + i,
                              **(prefill or {})) for i in range(prefills)]
        d_states = [MockState(name=f"d{i}", disaggregation_mode="decode", **(decode or {})) for i in range(decodes)]
        p_servers = [ServerThread(create_mock_app(s)).start() for s in p_states]
        d_servers = [ServerThread(create_mock_app(s)).start() for s in d_states]
        started.extend(p_servers + d_servers)
        workers = specs(p_servers, d_servers) if specs else (
            tuple(WorkerSpec(s.url, role="prefill") for s in p_servers)
            + tuple(WorkerSpec(s.url, role="decode") for s in d_servers))
        config = RouterConfig(workers=workers, policy=policy or PolicyConfig(),
                              reliability=reliability or FAST_RELIABILITY, **router_kwargs)
        app = create_app(config)
        router = ServerThread(app).start()
        started.append(router)
        return PDFleet(p_servers, d_servers, p_states, d_states, router, app)

    yield factory
    for server in reversed(started):
        server.stop(timeout_s=5)


@pytest.fixture
def fast_reliability() -> ReliabilityConfig:
    """The short timeouts and thresholds `make_fleet` uses by default (to derive variants)."""
    return FAST_RELIABILITY


@pytest.fixture
def make_fleet():
    """Factory: `make_fleet(n, admin_key=..., policy=PolicyConfig(...))` -> Fleet; stopped at teardown."""
    started: list[ServerThread] = []

    def factory(n: int = 2, policy: PolicyConfig | None = None, reliability: ReliabilityConfig | None = None,
                **router_kwargs) -> Fleet:
        states = [MockState(name=f"w{i}") for i in range(n)]
        workers = [ServerThread(create_mock_app(s)).start() for s in states]
        started.extend(workers)
        config = RouterConfig(workers=tuple(WorkerSpec(w.url) for w in workers),
                              policy=policy or PolicyConfig(), reliability=reliability or FAST_RELIABILITY,
                              **router_kwargs)
        app = create_app(config)
        router = ServerThread(app).start()
        started.append(router)
        return Fleet(workers, states, router, app)

    yield factory
    for server in reversed(started):
        server.stop(timeout_s=5)
