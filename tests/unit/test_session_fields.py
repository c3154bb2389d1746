"""Retention requests and the session fields the worker's guard writes into request bodies (pure)."""

from __future__ import annotations

import math

import pytest

from k3_sglang.router.retention import BadRetention, requested_retention
from k3_sglang.serving.retention import RetentionBook
from k3_sglang.serving.session_fields import RETAIN_PARAM, retention_of, session_fields


@pytest.mark.parametrize("headers,body,want", [
    ({}, {}, None),
    ({"x-session-retain-s": "30"}, {}, 30.0),
    ({}, {"session_retain_s": 12.5}, 12.5),
    ({"x-session-retain-s": "5"}, {"session_retain_s": 50}, 5.0),  # the header wins
    ({}, {"session_retain_s": 10**9}, 600.0),                       # clamped to the maximum
    ({"x-session-retain-s": "1e9"}, {}, 600.0),
    ({}, {"session_retain_s": 0}, 0.0),
])
def test_requested_retention(headers, body, want):
    assert requested_retention(headers, body, 600.0) == want


@pytest.mark.parametrize("headers,body,param", [
    ({"x-session-retain-s": "-1"}, {}, "X-Session-Retain-S"),
    ({"x-session-retain-s": "soon"}, {}, "X-Session-Retain-S"),
    ({"x-session-retain-s": "nan"}, {}, "X-Session-Retain-S"),
    ({}, {"session_retain_s": -3}, "session_retain_s"),
    ({}, {"session_retain_s": "30"}, None),  # a numeric string in JSON is accepted like the header
    ({}, {"session_retain_s": True}, "session_retain_s"),
    ({}, {"session_retain_s": [1]}, "session_retain_s"),
    ({}, {"session_retain_s": math.inf}, "session_retain_s"),
    ({"x-session-retain-s": "5"}, {"session_retain_s": "x"}, "session_retain_s"),
])
def test_bad_retention_names_the_header_or_field(headers, body, param):
    if param is None:
        assert requested_retention(headers, body, 600.0) == 30.0
        return
    with pytest.raises(BadRetention) as caught:
        requested_retention(headers, body, 600.0)
    assert caught.value.param == param and param in str(caught.value)


def test_session_fields_write_session_and_retention_where_sglang_reads_them():
    chat = {"model": "m", "messages": [], "session_retain_s": 20, "custom_params": {"k": 1}}
    out = session_fields("/v1/chat/completions", chat, {"x-session-id": "sess"}, 600.0)
    assert out == {"model": "m", "messages": [], "custom_params": {"k": 1, RETAIN_PARAM: 20.0}, "session_id": "sess"}
    gen = session_fields("/generate", {"input_ids": [1]}, {"x-session-retain-s": "9", "x-session-id": "s"}, 600.0)
    assert gen == {"input_ids": [1], "session_id": "s", "sampling_params": {"custom_params": {RETAIN_PARAM: 9.0}}}
    assert session_fields("/generate", {"input_ids": [1]}, {}, 600.0) is None
    own = {"input_ids": [1], "session_id": "client"}
    assert session_fields("/generate", own, {"x-session-id": "router"}, 600.0) is None  # the client's id stays
    assert session_fields("/generate", {"input_ids": [1], "session_params": {"id": "x"}},
                          {"x-session-id": "r"}, 600.0) is None
    assert session_fields("/generate", {"input_ids": [1], "session_retain_s": 0}, {}, 600.0) == {"input_ids": [1]}
    assert retention_of({RETAIN_PARAM: 9.0}) == 9.0 and retention_of(None) == 0.0 and retention_of({RETAIN_PARAM: -1}) == 0


def test_retention_book_against_a_brute_force_model():
    """Random bookings: the book never exceeds its bounds, releases soonest-expiring first, and every lock it
    took is released exactly once (or still held)."""
    import random

    rng = random.Random(0)
    book = RetentionBook(max_tokens=1_000, max_sessions=4)
    held: dict[int, str] = {}
    serial = iter(range(10**6))

    def lock(key):
        token = next(serial)
        held[token] = key
        return token

    def unlock(token):
        assert token in held  # each lock released once
        del held[token]

    now = 0.0
    for _ in range(2_000):
        now += rng.random() * 5
        key, tokens, seconds = f"s{rng.randrange(8)}", rng.randint(1, 1_200), rng.choice([0, 10, 60])
        before = {k: v.until for k, v in book.entries.items() if v.until > now}
        granted = book.retain(key, tokens, seconds, now, lambda k=key: lock(k), unlock)
        assert granted == (tokens <= 1_000 and seconds > 0)
        assert book.tokens == sum(e.tokens for e in book.entries.values()) <= 1_000
        assert len(book.entries) <= 4 and all(e.until > now for e in book.entries.values())
        assert sorted(held.values()) == sorted(book.entries)  # exactly the booked sessions hold a lock
        released = set(before) - set(book.entries) - {key}
        if released and granted:  # whoever had to go expired no later than whoever stayed
            assert max(before[k] for k in released) <= min(
                [before[k] for k in book.entries if k in before and k != key] + [math.inf])
