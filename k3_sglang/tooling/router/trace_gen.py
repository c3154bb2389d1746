"""Deterministic synthetic traces in Mooncake's JSONL format (`k3 router make-trace KIND`).

Both kinds are multi-turn sessions that resend their whole history, with block ids assigned the
way a prefix-block hasher would: equal ids mean an equal prefix; a block a later turn completes
(the previous partial block plus new tokens) gets a fresh id; a partial last block gets its own id.

- `shared-prompt`: every conversation opens with the same ~3,000-token system prompt (its first
  five 512-token blocks are identical everywhere, the sixth mixes it with the user's first words),
  then 1-12 turns of user messages (some long pastes) and answers, with think time between turns.
- `tool-agent`: agent sessions on one of six tool/agent prompts (3K-10K tokens, Zipf popularity,
  shared by every session on that agent), a short task, then 2-14 tool-call rounds: a short model
  output, a tool result appended, a short pause. Its shape follows the published statistics of
  Mooncake's tool&agent trace (average input ~8.6K tokens, output ~180, a large shared prefix).

No session ids are written: identity must be recovered from the prefixes, as for the public traces.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

BLOCK_TOKENS = 512
KINDS = ("shared-prompt", "tool-agent")


@dataclass(frozen=True)
class TraceShape:
    """Knobs of one synthetic trace (token counts unless named otherwise)."""

    sessions: int
    arrival_gap_s: float
    max_context: int = 120_000


class _Ids:
    """Fresh block ids and the id lists of sessions' stable prefixes."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def fresh(self) -> int:
        return next(self._next)

    def blocks(self, stable: list[int], input_length: int) -> list[int]:
        """Ids of a request's blocks: `stable` (grown with fresh ids) plus a fresh partial block."""
        full = input_length // BLOCK_TOKENS
        while len(stable) < full:
            stable.append(self.fresh())
        return stable[:full] + ([self.fresh()] if input_length % BLOCK_TOKENS else [])


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return int(min(high, max(low, rng.lognormvariate(math.log(median), sigma))))


def _service_s(input_length: int, output_length: int) -> float:
    """Rough time a turn takes to answer (used only to space a session's turns)."""
    return input_length / 12_000 + output_length * 0.03


def _conversation(rng: random.Random, ids: _Ids, start_s: float, system: list[int], system_tokens: int,
                  shape: TraceShape) -> Iterator[tuple[float, int, int, list[int]]]:
    stable = list(system)
    context, t = system_tokens, start_s
    turns = min(12, 1 + int(rng.expovariate(0.45)))
    for turn in range(turns):
        user = _lognormal(rng, 300 if turn == 0 else 180, 1.0, 8, 4_000)
        if rng.random() < 0.1:
            user += rng.randint(5_000, 30_000)  # a pasted document
        input_length = context + user
        if input_length > shape.max_context:
            return
        output = _lognormal(rng, 250, 0.8, 4, 1_500)
        yield t, input_length, output, ids.blocks(stable, input_length)
        del stable[input_length // BLOCK_TOKENS:]
        context = input_length + output
        t += _service_s(input_length, output) + rng.expovariate(1 / 25.0)


def _agent_session(rng: random.Random, ids: _Ids, start_s: float, agent: tuple[list[int], int],
                   shape: TraceShape) -> Iterator[tuple[float, int, int, list[int]]]:
    stable = list(agent[0])
    context = agent[1] + _lognormal(rng, 150, 0.8, 10, 2_000)
    t = start_s
    for _ in range(rng.randint(2, 14)):
        output = _lognormal(rng, 140, 0.8, 5, 800)
        if context > shape.max_context:
            return
        yield t, context, output, ids.blocks(stable, context)
        del stable[context // BLOCK_TOKENS:]
        tool_result = _lognormal(rng, 300, 1.0, 20, 6_000)
        t += _service_s(context, output) + rng.uniform(0.3, 6.0)
        context += output + tool_result


def _numbered(number: int, turns: Iterator[tuple]) -> Iterator[tuple]:
    for t, *rest in turns:
        yield (t, number, *rest)


def generate(kind: str, shape: TraceShape, seed: int = 0, with_sessions: bool = False) -> list[dict]:
    """The trace as Mooncake rows, ordered by timestamp (ties keep generation order).

    `with_sessions` adds the true `session_id` to each row (to check identity recovery against).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; known: {', '.join(KINDS)}")
    rng, ids = random.Random(seed), _Ids()
    if kind == "shared-prompt":
        system_tokens = 3_000
        system = [ids.fresh() for _ in range(system_tokens // BLOCK_TOKENS)]
    else:
        agents = []
        for _ in range(6):
            tokens = rng.randint(3_000, 10_000)
            agents.append(([ids.fresh() for _ in range(tokens // BLOCK_TOKENS)], tokens))
        weights = [1 / (rank + 1) for rank in range(len(agents))]
    sessions, start = [], 0.0
    for number in range(shape.sessions):
        start += rng.expovariate(1 / shape.arrival_gap_s)
        if kind == "shared-prompt":
            turns = _conversation(rng, ids, start, system, system_tokens, shape)
        else:
            turns = _agent_session(rng, ids, start, rng.choices(agents, weights)[0], shape)
        sessions.append(_numbered(number, turns))
    rows = []
    for t, number, input_length, output, blocks in heapq.merge(*sessions, key=lambda r: r[0]):
        row = {"timestamp": int(round(t * 1000)), "input_length": input_length, "output_length": output,
               "hash_ids": blocks}
        if with_sessions:
            row["session_id"] = f"session-{number}"
        rows.append(row)
    return rows


def default_shape(kind: str, sessions: int | None = None) -> TraceShape:
    """The shape `make-trace` uses for a kind (optionally with another session count)."""
    if kind == "shared-prompt":
        return TraceShape(sessions or 1_500, arrival_gap_s=0.4)
    return TraceShape(sessions or 800, arrival_gap_s=0.75)


def write_trace(path: str, rows: list[dict]) -> None:
    """Write rows as JSONL (one compact object per line)."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, separators=(", ", ": ")) + "\n")
