"""Multi-turn agent sessions against a server's `/generate` (token ids): what `k3 bench sessions` and the cached-session
tests send.

Each session opens with `first_tokens` prompt tokens; every later turn appends the model's answer and
`tool_tokens` of tool output (fresh random ids), so the context grows turn by turn. Sessions are sent one request
at a time, round-robin (session 0..N-1, then the next turn), optionally with a think time between requests: the
pattern that defeats LRU when the device pool holds fewer sessions than are live. Greedy decoding, so the answers
of two arms can be compared token for token.

`plan_session_prompts` is pure; `run_sessions` is the thin HTTP client (stream: the first chunk's arrival is the
TTFT; SGLang's meta_info gives cached tokens and, with HiCache, the per-tier split).
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from dataclasses import dataclass, field

TOKEN_RANGE = (10, 1000)  # ids inside k3-tiny's 1,024-token vocabulary, clear of its special tokens


@dataclass(frozen=True)
class SessionTraffic:
    """N sessions x turns of round-robin agent traffic."""

    sessions: int
    first_tokens: int
    tool_tokens: int
    output_tokens: int
    turns: int
    think_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sessions", "first_tokens", "output_tokens", "turns"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tool_tokens < 0 or self.think_s < 0:
            raise ValueError("tool_tokens and think_s must be >= 0")

    def session_tokens(self) -> int:
        """KV tokens one session holds after its last turn."""
        return self.first_tokens + self.turns * self.output_tokens + (self.turns - 1) * self.tool_tokens


@dataclass(frozen=True)
class TurnRecord:
    """One request of one session: its prompt length, the cache hits SGLang reported, TTFT and the answer."""

    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    cached_by_tier: dict = field(default_factory=dict)  # {"device": n, "host": n, "storage": n} when reported
    ttft_s: float = 0.0
    latency_s: float = 0.0
    output_ids: tuple[int, ...] = ()

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens the server computed (not served from any cache tier)."""
        return self.prompt_tokens - self.cached_tokens


def plan_session_prompts(traffic: SessionTraffic) -> tuple[list[list[int]], list[list[list[int]]]]:
    """(openings [N][first_tokens], tool outputs [N][turns-1][tool_tokens]): every random id the run appends.
    Each session draws from its own stream, so a run with more turns or sessions extends a shorter one."""
    openings, tools = [], []
    for s in range(traffic.sessions):
        rng = random.Random(f"{traffic.seed}/{s}")
        openings.append([rng.randrange(*TOKEN_RANGE) for _ in range(traffic.first_tokens)])
        tools.append([[rng.randrange(*TOKEN_RANGE) for _ in range(traffic.tool_tokens)]
                      for _ in range(traffic.turns - 1)])
    return openings, tools


def turn_prompt(traffic: SessionTraffic, records: list[TurnRecord], session: int, turn: int) -> list[int]:
    """The prompt ids `session` sent at `turn`, rebuilt from the traffic plan and the answers in `records`."""
    openings, tools = plan_session_prompts(traffic)
    said = {(r.session, r.turn): r.output_ids for r in records}
    ids = list(openings[session])
    for t in range(1, turn + 1):
        ids += list(said[(session, t - 1)]) + tools[session][t - 1]
    return ids


def generate(url: str, input_ids: list[int], max_new_tokens: int, timeout_s: float = 600.0) -> TurnRecord:
    """One greedy streamed `/generate` request; returns its TTFT, latency, answer and cache report
    (session/turn left 0)."""
    body = json.dumps({"input_ids": input_ids, "stream": True,
                       "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                           "ignore_eos": True}}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/generate", body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    ttft, last = None, None
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:"):])
            if "error" in chunk:
                raise RuntimeError(f"/generate failed: {chunk['error']}")
            if ttft is None:
                ttft = time.perf_counter() - start
            last = chunk
    if last is None:
        raise RuntimeError("/generate returned no chunk")
    meta = last["meta_info"]
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":  # e.g. a prompt longer than the KV pool
        raise RuntimeError(f"/generate aborted ({len(input_ids)} prompt tokens): {finish.get('message', finish)}")
    return TurnRecord(0, 0, len(input_ids), int(meta.get("cached_tokens", 0)),
                      dict(meta.get("cached_tokens_details") or {}), ttft or 0.0, time.perf_counter() - start,
                      tuple(last.get("output_ids", ())))


def run_sessions(url: str, traffic: SessionTraffic, on_turn=None, turns: range | None = None,
                 earlier: list[TurnRecord] = ()) -> list[TurnRecord]:
    """Send every turn of every session round-robin; returns the records in sending order.
    on_turn(record) is called after each request (progress, fault injection). `turns` sends only those turns (default
    all); `earlier` are the records of the turns before them (another server's, e.g. before a restart): their answers
    rebuild each session's history."""
    turns = range(traffic.turns) if turns is None else turns
    openings, tools = plan_session_prompts(traffic)
    history = [list(o) for o in openings]
    done = {(r.session, r.turn): r.output_ids for r in earlier}
    for turn in range(turns.start):
        for s in range(traffic.sessions):
            if (s, turn) not in done:
                raise ValueError(f"session {s} turn {turn}: no earlier record to resume from")
            history[s] += (tools[s][turn - 1] if turn else []) + list(done[(s, turn)])
    records: list[TurnRecord] = []
    for turn in turns:
        for s in range(traffic.sessions):
            if turn:
                history[s] += tools[s][turn - 1]
            rec = generate(url, history[s], traffic.output_tokens)
            rec = TurnRecord(s, turn, rec.prompt_tokens, rec.cached_tokens, rec.cached_by_tier, rec.ttft_s,
                             rec.latency_s, rec.output_ids)
            history[s] += list(rec.output_ids)
            records.append(rec)
            if on_turn is not None:
                on_turn(rec)
            if traffic.think_s:
                time.sleep(traffic.think_s)
    return records
