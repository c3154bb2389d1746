"""Session identity without keys: the radix-style session index, chat prefix keys, RouterCore.identify."""

from __future__ import annotations

import random

from k3_sglang.router.config import PolicyConfig
from k3_sglang.router.core import Capacity, RouterCore
from k3_sglang.router.policy import RouteRequest
from k3_sglang.router.session_index import SessionIndex
from k3_sglang.router.session_key import request_facts

CHAT = "/v1/chat/completions"
CFG = PolicyConfig(block_tokens=64)  # 256-character text blocks: prompts of a few blocks stay small


def test_follow_up_continues_and_tip_moves():
    index = SessionIndex(100)
    index.record("a", [1, 2, 3])
    assert index.find([1, 2, 3, 4, 5]) == "a"  # extends a's last request
    index.record("a", [1, 2, 3, 4, 5])
    assert index.tip_of("a") == 5 and index.find([1, 2, 3, 9]) is None  # the old tip no longer names a
    assert index.find([7, 8]) is None


def test_a_key_two_sessions_went_through_names_nobody():
    index = SessionIndex(100)
    index.record("a", [1, 2])  # a's first request ends at 2
    index.record("b", [1, 3])  # b shares block 1 (a system prompt), diverges
    index.record("c", [1])  # c's whole request is the shared block
    assert index.find([1, 2, 6]) == "a" and index.find([1, 3, 6]) == "b"
    assert index.find([1, 5]) is None  # c's tip sits on a shared key: a new conversation is not c


def test_keyed_sessions_mark_keys_but_have_no_tip():
    index = SessionIndex(100)
    index.record("user:x", [1, 2], move_tip=False)
    assert len(index) == 0 and index.find([1, 2, 3]) is None
    index.record("auto", [1, 2])  # a keyless request ending where the keyed one went
    assert index.find([1, 2, 3]) is None  # shared with the keyed session


def test_bounded_and_forget():
    index = SessionIndex(max_keys=4)
    for s in range(10):
        index.record(f"s{s}", [100 + s])
    assert index.keys_seen == 4 and len(index) == 10
    index.forget("s9")
    assert index.find([109]) is None and index.tip_of("s9") is None


def _chat(system: str, *turns: str) -> dict:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def _route(core: RouterCore, body: dict, now: float) -> str:
    facts = request_facts(CHAT, {}, body, CFG)
    session_id = facts.explicit_session or core.identify(facts.session_keys)[0]
    request = RouteRequest(session_id, facts.context_tokens, facts.growth_tokens, facts.session_keys,
                           facts.explicit_session is None)
    _, ticket = core.route(request, facts.prefix_hashes, now)
    core.complete(ticket, now, ok=True, output_tokens=8)
    return session_id


def _core() -> RouterCore:
    core = RouterCore(CFG)
    for i in range(2):
        core.add_worker(f"w{i}", Capacity(1_000_000, 64, 10_000.0))
    return core


def test_conversations_behind_one_long_system_prompt_stay_apart():
    rng = random.Random(0)
    system = "".join(rng.choice("abcdefgh ") for _ in range(8_000))  # ~31 blocks, identical everywhere
    core = _core()
    sessions = [_route(core, _chat(system, f"question {i}"), now=i) for i in range(6)]
    assert len(set(sessions)) == 6  # the opening key of old merged all six
    for i, sid in enumerate(sessions):  # each follow-up (history resent) finds its own conversation
        assert _route(core, _chat(system, f"question {i}", f"answer {i}", "more"), now=10 + i) == sid
    assert len(core.fleet.sessions) == 6


def test_identical_openings_share_until_they_diverge():
    core = _core()
    first = _route(core, _chat("sys", "hello"), now=0)
    assert _route(core, _chat("sys", "hello"), now=1) == first  # indistinguishable: one session
    assert _route(core, _chat("sys", "hello", "hi A", "from A"), now=2) == first
    other = _route(core, _chat("sys", "hello", "hi B", "from B"), now=3)
    assert other != first  # diverged: a session of its own
    assert _route(core, _chat("sys", "hello", "hi B", "from B", "ok", "again"), now=4) == other
    assert _route(core, _chat("sys", "hello", "hi A", "from A", "ok", "again"), now=5) == first


def test_explicit_keys_still_win_and_user_messages_without_reply_continue():
    core = _core()
    body = _chat("sys", "hello")
    keyed = request_facts(CHAT, {"x-session-id": "agent-1"}, body, CFG)
    assert keyed.explicit_session == "agent-1" and keyed.session_source == "x-session-id"
    sid = _route(core, _chat("sys", "a long first question " * 40), now=0)
    retry = _chat("sys", "a long first question " * 40)
    retry["messages"].append({"role": "user", "content": "are you there?"})  # no assistant turn between
    assert _route(core, retry, now=1) == sid


def test_identify_ignores_expired_sessions():
    core = RouterCore(PolicyConfig(block_tokens=64, session_ttl_s=10))
    core.add_worker("w0", Capacity(1_000_000, 64, 10_000.0))
    sid = _route(core, _chat("sys", "hello there"), now=0)
    assert core.expire_sessions(100) == 1
    again, source = core.identify(request_facts(CHAT, {}, _chat("sys", "hello there", "x", "y"), CFG).session_keys)
    assert again != sid and source == "new"
