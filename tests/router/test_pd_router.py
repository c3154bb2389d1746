"""PD pairing through the router, against mock prefill/decode servers that imitate SGLang's PD protocol."""

from __future__ import annotations

import time

import httpx
import openai
import orjson
import pytest

from k3_sglang import cli
from k3_sglang.router.cli import build_serve_config
from k3_sglang.router.config import ConfigError, RouterConfig, WorkerSpec
from k3_sglang.router.pd import KVLayout, layout_mismatch, preflight_problems, with_bootstrap


def generate(fleet, text="hello world", session=None, timeout=10.0, **extra) -> httpx.Response:
    headers = {"X-Session-Id": session} if session else {}
    body = {"text": text, "sampling_params": {"max_new_tokens": 3}, **extra}
    return httpx.post(fleet.router.url + "/generate", json=body, headers=headers, timeout=timeout)


def eventually(check, timeout_s: float = 3.0) -> bool:
    """Poll `check()` until true (a mock notices a dropped connection asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def last_body(state) -> dict:
    return orjson.loads(state.last_body)


def test_each_request_goes_to_a_pair_with_the_same_bootstrap_room(make_pd_fleet):
    fleet = make_pd_fleet(prefills=1, decodes=1)
    resp = generate(fleet)
    assert resp.status_code == 200, resp.text
    assert resp.json()["text"].startswith("p0>d0-t0")  # the decode answer, fed by prefill p0
    assert resp.headers["x-k3-worker"] == fleet.decodes[0].url
    assert resp.headers["x-k3-prefill-worker"] == fleet.prefills[0].url
    p_body, d_body = last_body(fleet.prefill_states[0]), last_body(fleet.decode_states[0])
    assert p_body == d_body  # the same body goes to both legs
    assert p_body["bootstrap_host"] == "127.0.0.1"
    assert p_body["bootstrap_port"] == 20000  # read from the prefill server's /get_server_info
    assert isinstance(p_body["bootstrap_room"], int) and p_body["bootstrap_room"] >= 0
    second = generate(fleet)
    assert second.status_code == 200
    assert fleet.decode_states[0].rooms[0] != fleet.decode_states[0].rooms[1]  # a fresh room per request
    assert fleet.wait_idle()


def test_a_configured_bootstrap_port_wins_and_a_wrong_one_never_hangs(make_pd_fleet):
    fleet = make_pd_fleet(specs=lambda p, d: (WorkerSpec(p[0].url, role="prefill", bootstrap_port=20000),
                                              WorkerSpec(d[0].url, role="decode")))
    assert generate(fleet).status_code == 200
    assert last_body(fleet.decode_states[0])["bootstrap_port"] == 20000


def test_batched_generate_gets_one_room_per_prompt(make_pd_fleet):
    fleet = make_pd_fleet()
    resp = httpx.post(fleet.router.url + "/generate", json={"text": ["a", "b", "c"]}, timeout=10)
    assert resp.status_code == 200, resp.text
    body = last_body(fleet.decode_states[0])
    assert body["bootstrap_host"] == ["127.0.0.1"] * 3 and body["bootstrap_port"] == [20000] * 3
    assert len(set(body["bootstrap_room"])) == 3


def test_parallel_sampling_is_refused_with_a_clear_error(make_pd_fleet):
    fleet = make_pd_fleet()
    resp = generate(fleet, sampling_params={"max_new_tokens": 2, "n": 2})
    assert resp.status_code == 400
    assert "n > 1 is not supported through PD" in resp.json()["error"]["message"]
    assert fleet.prefill_states[0].requests == 0 and fleet.decode_states[0].requests == 0


def test_sessions_stick_to_their_decode_server_and_spread(make_pd_fleet):
    fleet = make_pd_fleet(prefills=1, decodes=2)
    homes = {}
    for turn in range(4):
        for session in ("s1", "s2"):
            resp = generate(fleet, text=f"{session} turn {turn}", session=session)
            assert resp.status_code == 200, resp.text
            homes.setdefault(session, set()).add(resp.headers["x-k3-worker"])
    assert all(len(h) == 1 for h in homes.values())
    assert homes["s1"] != homes["s2"]  # the second session went to the emptier decode server
    assert fleet.wait_idle()


def test_openai_client_through_the_pair(make_pd_fleet):
    fleet = make_pd_fleet()
    client = openai.OpenAI(base_url=fleet.router.url + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(model="mock-k3", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
    assert reply.choices[0].message.content.startswith("p0>d0-t0")
    chunks = list(client.chat.completions.create(model="mock-k3", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks).startswith("p0>d0-t0")
    assert fleet.wait_idle()


def test_a_failing_prefill_cancels_the_decode_leg_and_retries_on_another_prefill(make_pd_fleet):
    fleet = make_pd_fleet(prefills=2, decodes=1, decode={"bootstrap_timeout_s": 30.0})
    first = generate(fleet, session="a")
    failing = [i for i, p in enumerate(fleet.prefills) if p.url == first.headers["x-k3-prefill-worker"]][0]
    httpx.post(fleet.prefills[failing].url + "/_fault", json={"mode": "error", "count": -1}, timeout=5)
    started = time.monotonic()
    resp = generate(fleet, session="a", text="a second turn")
    assert resp.status_code == 200, resp.text
    assert time.monotonic() - started < 5  # not the 30 s the decode leg would have waited
    assert resp.headers["x-k3-prefill-worker"] != fleet.prefills[failing].url
    assert fleet.wait_idle()
    assert eventually(lambda: fleet.decode_states[0].pd_cancelled >= 1)  # the orphaned decode leg was dropped, not left waiting


def test_the_only_prefill_failing_is_a_fast_clear_502(make_pd_fleet):
    fleet = make_pd_fleet(prefills=1, decodes=1, decode={"bootstrap_timeout_s": 30.0})
    httpx.post(fleet.prefills[0].url + "/_fault", json={"mode": "error", "count": -1}, timeout=5)
    started = time.monotonic()
    resp = generate(fleet)
    assert time.monotonic() - started < 5
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_failed"
    assert fleet.wait_idle()


def test_a_prefill_4xx_is_the_answer_and_the_decode_leg_is_dropped(make_pd_fleet):
    fleet = make_pd_fleet(decode={"bootstrap_timeout_s": 30.0})
    httpx.post(fleet.prefills[0].url + "/_fault", json={"mode": "reject", "count": 1}, timeout=5)
    started = time.monotonic()
    resp = generate(fleet)
    assert resp.status_code == 400 and "rejected" in resp.json()["error"]["message"]
    assert time.monotonic() - started < 5
    assert fleet.wait_idle()
    assert eventually(lambda: fleet.decode_states[0].pd_cancelled == 1)


def test_prefill_back_pressure_reaches_the_client_as_429(make_pd_fleet):
    fleet = make_pd_fleet(decode={"bootstrap_timeout_s": 30.0})
    httpx.post(fleet.prefills[0].url + "/_fault", json={"mode": "overloaded", "delay_s": 1, "count": -1}, timeout=5)
    started = time.monotonic()
    resp = generate(fleet)
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "worker_backpressure"
    assert time.monotonic() - started < 5
    assert fleet.wait_idle()


def test_a_killed_decode_server_re_pairs_the_session(make_pd_fleet):
    fleet = make_pd_fleet(prefills=1, decodes=2)
    first = generate(fleet, session="s")
    home = first.headers["x-k3-worker"]
    index = [d.url for d in fleet.decodes].index(home)
    fleet.decodes[index].stop(timeout_s=5)  # the decode server dies between turns
    started = time.monotonic()
    resp = generate(fleet, session="s", text="turn two")
    assert resp.status_code == 200, resp.text
    assert time.monotonic() - started < 5
    assert resp.headers["x-k3-worker"] != home
    assert generate(fleet, session="s", text="turn three").headers["x-k3-worker"] == resp.headers["x-k3-worker"]
    metrics = httpx.get(fleet.router.url + "/metrics", timeout=5).text
    assert "k3_router_pd_repairs_total 1.0" in metrics
    assert 'k3_router_pd_leg_failures_total{role="decode"} 1.0' in metrics
    assert fleet.wait_idle()


def test_a_decode_dying_mid_stream_ends_the_stream_with_an_error_event(make_pd_fleet):
    fleet = make_pd_fleet(decode={"reply_tokens": 6})
    httpx.post(fleet.decodes[0].url + "/_fault", json={"mode": "die_mid_stream", "chunks_before_death": 2,
                                                       "count": 1}, timeout=5)
    with httpx.stream("POST", fleet.router.url + "/generate", json={"text": "x", "stream": True}, timeout=10) as r:
        text = "".join(r.iter_text())
    assert '"upstream_stream_broken"' in text and text.rstrip().endswith("data: [DONE]")
    assert fleet.wait_idle()


def test_the_only_decode_dead_is_a_clear_error_not_a_hang(make_pd_fleet):
    fleet = make_pd_fleet(prefills=1, decodes=1)
    fleet.decodes[0].stop(timeout_s=5)
    started = time.monotonic()
    resp = generate(fleet)
    assert time.monotonic() - started < 5
    assert resp.status_code in (502, 503)
    assert fleet.decodes[0].url in resp.json()["error"]["message"] or "decode" in resp.json()["error"]["message"]
    assert fleet.wait_idle()


@pytest.mark.parametrize(("field", "prefill", "fragment"), [
    ("page_size", {"page_size": 64}, "page_size 64 on prefill"),
    ("kv_cache_dtype", {"kv_cache_dtype": "fp8_e4m3"}, "kv_cache_dtype fp8_e4m3 on prefill"),
])
def test_mismatched_kv_layouts_never_pair(make_pd_fleet, field, prefill, fragment):
    fleet = make_pd_fleet(prefill=prefill)
    resp = generate(fleet)
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "pd_layout_mismatch" and fragment in error["message"]
    assert fleet.prefill_states[0].requests == 0 and fleet.decode_states[0].requests == 0
    ready = httpx.get(fleet.router.url + "/readiness", timeout=5)
    assert ready.status_code == 503 and fragment in ready.json()["pairing_problem"]


def test_a_decode_server_without_a_compatible_prefill_is_skipped(make_pd_fleet):
    # two prefill layouts, two decode layouts: each decode pairs only with its own kind
    fleet = make_pd_fleet(prefills=1, decodes=2)
    fleet.core.fleet.workers[fleet.decodes[1].url].layout = KVLayout(64, "auto", "float32", "mooncake")
    for i in range(4):
        resp = generate(fleet, session=f"s{i}")
        assert resp.status_code == 200
        assert resp.headers["x-k3-worker"] == fleet.decodes[0].url


def test_a_server_reporting_another_role_is_refused(make_pd_fleet):
    # the "prefill" URL is really a decode server
    fleet = make_pd_fleet(prefills=1, decodes=2, specs=lambda p, d: (
        WorkerSpec(d[1].url, role="prefill"), WorkerSpec(d[0].url, role="decode")))
    resp = generate(fleet)
    assert resp.status_code == 503
    assert "reports disaggregation_mode decode: pass it with --decode" in resp.json()["error"]["message"]
    assert fleet.decode_states[0].requests == 0 and fleet.decode_states[1].requests == 0
    text = httpx.get(fleet.router.url + "/metrics", timeout=5).text
    assert f'k3_router_worker_role{{role="prefill",worker="{fleet.decodes[1].url}"}} 0.0' in text


def test_metrics_report_both_roles(make_pd_fleet):
    fleet = make_pd_fleet(prefills=1, decodes=2)
    assert generate(fleet, session="m").status_code == 200
    fleet.wait_idle()
    text = httpx.get(fleet.router.url + "/metrics", timeout=5).text
    assert f'k3_router_worker_role{{role="prefill",worker="{fleet.prefills[0].url}"}} 1.0' in text
    assert f'k3_router_worker_role{{role="decode",worker="{fleet.decodes[1].url}"}} 1.0' in text
    assert 'k3_router_role_workers{role="decode"} 2.0' in text
    assert 'k3_router_role_healthy_workers{role="prefill"} 1.0' in text
    assert 'k3_router_role_state_slots{role="decode"} 32.0' in text  # 16 per mock decode server
    assert 'k3_router_role_resident_sessions{role="prefill"} 1.0' in text
    assert 'k3_router_pd_pairs_total{decode="' in text
    ready = httpx.get(fleet.router.url + "/readiness", timeout=5).json()
    assert ready == {"ready": True, "prefill_workers": 1, "decode_workers": 2, "pairable_decode_workers": 2}


def test_admin_views_of_a_pd_session(make_pd_fleet):
    fleet = make_pd_fleet(admin_key="k")
    assert generate(fleet, session="adm").status_code == 200
    fleet.wait_idle()
    headers = {"X-Admin-Key": "k"}
    session = httpx.get(fleet.router.url + "/sessions/adm", headers=headers, timeout=5).json()
    assert session["worker"] == fleet.decodes[0].url and session["prefill_worker"] == fleet.prefills[0].url
    workers = {w["url"]: w for w in httpx.get(fleet.router.url + "/workers", headers=headers, timeout=5).json()["workers"]}
    assert workers[fleet.prefills[0].url]["role"] == "prefill"
    assert workers[fleet.prefills[0].url]["bootstrap_port"] == 20000
    assert workers[fleet.decodes[0].url]["kv_layout"]["page_size"] == 1
    bad = httpx.post(fleet.router.url + "/workers", headers=headers, json={"url": "http://127.0.0.1:9"}, timeout=5)
    assert bad.status_code == 400 and "role mixed in a router of PD" in bad.json()["error"]["message"]
    assert httpx.delete(fleet.router.url + "/sessions/adm", headers=headers, timeout=5).status_code == 200
    assert "adm#prefill" not in fleet.core.fleet.sessions


# ---- pure pieces ------------------------------------------------------------------------------

def test_layout_mismatch_names_every_differing_field():
    a = KVLayout(1, "auto", "float32", "mooncake")
    assert layout_mismatch("p", a, "d", a) == ""
    assert layout_mismatch("p", a, "d", None) == ""  # not known yet: judged when reported
    why = layout_mismatch("p", KVLayout(64, "auto", "bfloat16", "nixl"), "d", a)
    assert "page_size 64 on prefill p but 1 on decode d" in why
    assert "kv_cache_dtype auto (bfloat16) on prefill p but auto (float32)" in why
    assert "transfer_backend nixl" in why


def test_with_bootstrap_shapes():
    import random

    rng = random.Random(0)
    single = with_bootstrap({"prompt": [1, 2, 3]}, "/v1/completions", "h", 1, rng)
    assert single["bootstrap_host"] == "h" and isinstance(single["bootstrap_room"], int)
    batch = with_bootstrap({"prompt": ["a", "b"]}, "/v1/completions", "h", 1, rng)
    assert batch["bootstrap_port"] == [1, 1] and len(batch["bootstrap_room"]) == 2
    ids = with_bootstrap({"input_ids": [[1], [2]]}, "/generate", "h", 1, rng)
    assert len(ids["bootstrap_room"]) == 2


def test_preflight_problems():
    prefill = {"disaggregation_mode": "prefill", "page_size": 1, "kv_cache_dtype": "auto", "dtype": "float32"}
    decode = dict(prefill, disaggregation_mode="decode")
    assert preflight_problems([("p", "prefill"), ("d", "decode")], {"p": prefill, "d": decode}) == []
    assert preflight_problems([("p", "prefill"), ("d", "decode")], {"p": prefill}) == []  # d not up yet
    wrong = preflight_problems([("p", "mixed")], {"p": prefill})
    assert wrong == ["p was given as --worker but reports disaggregation_mode prefill: pass it with --prefill"]
    paged = preflight_problems([("p", "prefill"), ("d", "decode")], {"p": prefill, "d": dict(decode, page_size=64)})
    assert len(paged) == 1 and "page_size 1 on prefill p but 64 on decode d" in paged[0]


# ---- command line -----------------------------------------------------------------------------

def parse(argv):
    return cli.build_parser("router").parse_args(argv)


def test_prefill_and_decode_flags():
    config = build_serve_config(parse(["router", "--prefill", "http://127.0.0.1:30000", "9000",
                                       "--prefill", "127.0.0.1:30002", "--decode", "http://127.0.0.1:30001"]))
    assert [(w.url, w.role, w.bootstrap_port) for w in config.workers] == [
        ("http://127.0.0.1:30000", "prefill", 9000), ("http://127.0.0.1:30002", "prefill", None),
        ("http://127.0.0.1:30001", "decode", None)]
    assert config.disaggregated


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--prefill", "http://127.0.0.1:1"], "needs at least one decode server"),
    (["--decode", "http://127.0.0.1:1"], "needs at least one prefill server"),
    (["--worker", "http://127.0.0.1:1", "--prefill", "http://127.0.0.1:2", "--decode", "http://127.0.0.1:3"],
     "cannot be combined"),
    (["--prefill", "http://127.0.0.1:2", "port", "--decode", "http://127.0.0.1:3"], "bootstrap port must be a number"),
    (["--prefill", "http://127.0.0.1:2", "70000", "--decode", "http://127.0.0.1:3"], "bootstrap_port must be 1..65535"),
])
def test_bad_pd_command_lines(capsys, argv, fragment):
    assert cli.main(["router", *argv]) == 2
    assert fragment in capsys.readouterr().err


def test_router_start_refuses_a_certain_role_or_layout_problem(make_pd_fleet, capsys):
    fleet = make_pd_fleet(prefill={"page_size": 64})
    p, d = fleet.prefills[0].url, fleet.decodes[0].url
    assert cli.main(["router", "--prefill", p, "--decode", d, "--port", "1"]) == 2
    assert "no prefill and decode server can pair: page_size 64 on prefill" in capsys.readouterr().err
    assert cli.main(["router", "--worker", d, "--port", "1"]) == 2
    assert "reports disaggregation_mode decode: pass it with --decode" in capsys.readouterr().err


def test_worker_specs_validate_roles():
    with pytest.raises(ConfigError, match="role must be one of"):
        WorkerSpec("http://h:1", role="both")
    with pytest.raises(ConfigError, match="bootstrap_port is a prefill server's setting"):
        WorkerSpec("http://h:1", role="decode", bootstrap_port=8998)
    with pytest.raises(ConfigError, match="cannot be combined"):
        RouterConfig(workers=(WorkerSpec("http://h:1"), WorkerSpec("http://h:2", role="decode"),
                              WorkerSpec("http://h:3", role="prefill")))


@pytest.mark.parametrize("read_timeout_s, status", [(0.5, 502), (5.0, 200)])
def test_kv_arriving_after_the_read_timeout_is_a_502_and_a_longer_timeout_serves_it(
        make_pd_fleet, fast_reliability, read_timeout_s, status):
    """The pd_bench 16K x 8 failure: the decode server sends no byte until the prompt's KV arrives, so a
    prefill queue longer than `reliability.read_timeout_s` fails the decode leg; with the only decode
    server excluded the client gets 502 `upstream_failed`. A longer read timeout serves the same request."""
    import dataclasses

    fleet = make_pd_fleet(prefills=1, decodes=1, prefill={"transfer_delay_s": 1.5},
                          decode={"bootstrap_timeout_s": 30.0},
                          reliability=dataclasses.replace(fast_reliability, read_timeout_s=read_timeout_s))
    resp = generate(fleet)
    assert resp.status_code == status, resp.text[:300]
    if status == 502:
        assert resp.json()["error"]["code"] == "upstream_failed"
        assert "read timeout (no byte within reliability.read_timeout_s = 0.5 s)" in resp.json()["error"]["message"]
    assert fleet.wait_idle()
