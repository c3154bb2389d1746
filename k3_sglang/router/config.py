"""Router configuration: frozen dataclasses and the YAML loader.

A YAML file mirrors the dataclasses one to one:

    host: 127.0.0.1
    port: 30080
    workers:
      - url: http://127.0.0.1:30000
        kv_tokens: 131072        # per rank, before DCP: capacity = kv_tokens * dcp_size
        dcp_size: 8
        state_slots: 48          # KDA state slots per TP group
        prefill_tokens_per_s: 12000
    policy: {session_ttl_s: 1800, admission: reject}
    reliability: {health_interval_s: 5}

Fields left out of a worker are read from the worker (`/get_server_info`, `/v1/loads`) and
refreshed while the router runs; the worker reports KV capacity in logical tokens (DCP included).
PD disaggregation: workers with `role: prefill` (optionally `bootstrap_port`, else read from the
server) and `role: decode`, never mixed with `role: mixed` ones (docs/pd.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml


class ConfigError(ValueError):
    """A configuration value or file is wrong; the message says which and why."""


MIXED, PREFILL, DECODE = "mixed", "prefill", "decode"
ROLES = (MIXED, PREFILL, DECODE)


@dataclass(frozen=True)
class WorkerSpec:
    """One SGLang worker. Unset capacities are discovered from the worker itself."""

    url: str
    kv_tokens: int | None = None  # per rank (before DCP), as SGLang's --max-total-tokens
    dcp_size: int | None = None
    state_slots: int | None = None
    prefill_tokens_per_s: float | None = None
    role: str = MIXED  # mixed (prefill and decode on one server), or a PD prefill / decode server
    bootstrap_port: int | None = None  # prefill only: its --disaggregation-bootstrap-port (else read)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalize_worker_url(self.url))
        for name in ("kv_tokens", "dcp_size", "state_slots", "prefill_tokens_per_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"worker {self.url}: {name} must be a positive number, got {value!r}")
        if self.role not in ROLES:
            raise ConfigError(f"worker {self.url}: role must be one of {', '.join(ROLES)}, got {self.role!r}")
        port = self.bootstrap_port
        if port is not None:
            if self.role != PREFILL:
                raise ConfigError(f"worker {self.url}: bootstrap_port is a prefill server's setting (role {self.role})")
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ConfigError(f"worker {self.url}: bootstrap_port must be 1..65535, got {port!r}")


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the placement cost model (see docs/router.md for the formulas)."""

    block_tokens: int = 512
    chars_per_token: float = 4.0
    kv_barrier_s: float = 0.25
    kv_headroom: float = 0.05
    expected_growth_tokens: int = 2048
    move_penalty_s: float = 5.0
    move_penalty_factor: float = 1.0
    default_prefill_tokens_per_s: float = 8000.0
    default_kv_tokens: int = 131072
    default_state_slots: int = 48
    session_ttl_s: float = 1800.0
    prefix_index_entries: int = 1_000_000
    session_index_keys: int = 1_000_000
    learn_prefill_tps: bool = True
    max_predicted_ttft_s: float = 300.0
    max_waiting_requests: int = 256
    admission: str = "reject"
    queue_max: int = 64
    queue_timeout_s: float = 10.0
    retry_after_s: int = 5
    backpressure_s: float = 2.0
    kv_events: bool = True           # subscribe to the KV events a worker advertises (event_subscriber.py)
    event_index_blocks: int = 4_000_000  # per worker; past it the index empties itself (partial)
    event_replay_timeout_s: float = 2.0
    max_retain_s: float = 3600.0     # longest session retention forwarded (longer asks are clamped)
    prefetch_min_tokens: int = 512   # prefetch when at least this much of a turn's prefix is off the device (0: off)
    prefetch_timeout_s: float = 30.0
    session_home: str = "score"      # a new session's home: lowest score, or rendezvous hashing (replicas.py)

    def __post_init__(self) -> None:
        if self.admission not in ("reject", "queue"):
            raise ConfigError(f"policy.admission must be 'reject' or 'queue', got {self.admission!r}")
        if self.session_home not in ("score", "rendezvous"):
            raise ConfigError(f"policy.session_home must be 'score' or 'rendezvous', got {self.session_home!r}")
        if not 0.0 <= self.kv_headroom < 1.0:
            raise ConfigError(f"policy.kv_headroom must be in [0, 1), got {self.kv_headroom}")
        for name in ("block_tokens", "chars_per_token", "default_prefill_tokens_per_s", "session_ttl_s",
                     "max_predicted_ttft_s", "prefix_index_entries", "session_index_keys", "backpressure_s",
                     "event_index_blocks", "event_replay_timeout_s"):
            if _not_number(getattr(self, name)) or getattr(self, name) <= 0:
                raise ConfigError(f"policy.{name} must be positive, got {getattr(self, name)!r}")
        if _not_number(self.max_waiting_requests) or self.max_waiting_requests < 0:
            raise ConfigError(f"policy.max_waiting_requests must be >= 0 (0: off), got {self.max_waiting_requests!r}")

    @property
    def block_chars(self) -> int:
        """Characters per prefix block when hashing text (block_tokens at chars_per_token)."""
        return max(1, int(self.block_tokens * self.chars_per_token))


@dataclass(frozen=True)
class ReliabilityConfig:
    """Health probing, circuit breaking, retries and timeouts."""

    health_interval_s: float = 5.0
    health_timeout_s: float = 3.0
    health_path: str = "/v1/loads"
    health_fail_threshold: int = 3
    health_success_threshold: int = 2
    breaker_failure_threshold: int = 5
    breaker_success_threshold: int = 2
    breaker_open_s: float = 10.0
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 300.0
    write_timeout_s: float = 30.0
    pool_timeout_s: float = 5.0
    max_retries: int = 2
    retry_backoff_s: float = 0.05
    max_connections_per_worker: int = 256
    breaker_half_open_trials: int = 4
    capacity_refresh_s: float = 30.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "health_path":
                if not isinstance(value, str) or not value.startswith("/"):
                    raise ConfigError(f"reliability.health_path must start with '/', got {value!r}")
            elif _not_number(value) or value < 0 or (value == 0 and f.name not in ("max_retries", "retry_backoff_s")):
                raise ConfigError(f"reliability.{f.name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class RouterConfig:
    """Everything `k3 router` needs to start."""

    workers: tuple[WorkerSpec, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    host: str = "127.0.0.1"
    port: int = 30080
    admin_key: str | None = None
    api_key: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    events_curve_key: str | None = None         # the router's ZMQ certificate (both keys), for CURVE-protected events
    events_curve_server_key: str | None = None  # the workers' public ZMQ certificate

    def __post_init__(self) -> None:
        check_roles(self.workers)
        if (self.events_curve_key is None) != (self.events_curve_server_key is None):
            raise ConfigError("events_curve_key and events_curve_server_key go together (the router's certificate "
                              "and the workers' public one)")

    @property
    def disaggregated(self) -> bool:
        """True when the workers are PD prefill and decode servers."""
        return any(w.role != MIXED for w in self.workers)


def check_roles(workers: tuple[WorkerSpec, ...]) -> None:
    """PD needs prefill and decode servers and no mixed ones beside them (ConfigError otherwise)."""
    roles = {w.role for w in workers}
    if MIXED in roles and len(roles) > 1:
        raise ConfigError("mixed workers (--worker) and PD workers (--prefill/--decode) cannot be combined: "
                          "a PD server only serves requests that carry bootstrap fields")
    if roles in ({PREFILL}, {DECODE}):
        missing = DECODE if PREFILL in roles else PREFILL
        raise ConfigError(f"PD disaggregation needs at least one {missing} server (--{missing} URL)")


def _not_number(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, (int, float))


def normalize_worker_url(url: str) -> str:
    """Return `scheme://host:port` for a worker URL, or raise ConfigError."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"worker url must be a non-empty string, got {url!r}")
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"bad worker url {url!r}: expected http://host:port")
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"bad worker url {url!r}: {exc}") from None
    if parts.path not in ("", "/"):
        raise ConfigError(f"bad worker url {url!r}: no path allowed")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def _build(cls: type, values: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys."""
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(values).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_config_mapping(data: Any) -> RouterConfig:
    """Build a RouterConfig from an already-parsed YAML mapping."""
    if not isinstance(data, dict):
        raise ConfigError("config file must contain a mapping at top level")
    data = dict(data)
    raw_workers = data.pop("workers", []) or []
    if not isinstance(raw_workers, list):
        raise ConfigError("workers must be a list")
    workers = tuple(
        WorkerSpec(url=w) if isinstance(w, str) else _build(WorkerSpec, w, f"workers[{i}]")
        for i, w in enumerate(raw_workers)
    )
    policy = _build(PolicyConfig, data.pop("policy", None), "policy")
    reliability = _build(ReliabilityConfig, data.pop("reliability", None), "reliability")
    top = _build(RouterConfig, data, "config")
    return dataclasses.replace(top, workers=workers, policy=policy, reliability=reliability)


def load_config_file(path: str) -> RouterConfig:
    """Read a YAML config file into a RouterConfig (ConfigError on any problem)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    return parse_config_mapping(data or {})
