"""`k3 router` and `k3 router replay` command lines, including bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3_sglang import cli
from k3_sglang.router.cli import build_serve_config
from k3_sglang.router.config import ConfigError, load_config_file

DATA = Path(__file__).resolve().parents[1] / "data" / "router"
TRACE = str(DATA / "shared-prompt-300.jsonl")  # written by `k3 router make-trace` (test_replay.py checks)


def parse(argv):
    return cli.build_parser("router").parse_args(argv)


def test_serve_options_on_the_parent_parser(tmp_path):
    config_file = tmp_path / "workers.yaml"
    config_file.write_text(
        "port: 31111\nworkers:\n  - url: http://127.0.0.1:30000\n    kv_tokens: 131072\n    dcp_size: 8\n"
        "    state_slots: 48\npolicy: {session_ttl_s: 60}\n"
    )
    args = parse(["router", "--worker", "127.0.0.1:30001", "--config", str(config_file), "--api-key", "k"])
    config = build_serve_config(args)
    assert [w.url for w in config.workers] == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert config.workers[0].kv_tokens == 131072 and config.workers[0].dcp_size == 8
    assert config.port == 31111 and config.host == "127.0.0.1" and config.api_key == "k"
    assert config.policy.session_ttl_s == 60


def test_serve_without_workers_is_a_cli_error(capsys):
    assert cli.main(["router"]) == 2
    assert "k3 router: error: no workers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("workers: [{url: 'http://h:1', colour: red}]", "unknown key(s) colour"),
        ("workers: [{url: 'http://h:1', kv_tokens: 0}]", "kv_tokens must be a positive number"),
        ("workers: [{url: 'ftp://h/x'}]", "bad worker url"),
        ("policy: {admission: maybe}", "policy.admission"),
        ("workers: [", "not valid YAML"),
        ("- just a list", "mapping at top level"),
    ],
)
def test_bad_config_files(tmp_path, capsys, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load_config_file(str(path))
    assert fragment in str(info.value)
    assert cli.main(["router", "--config", str(path)]) == 2
    assert fragment in capsys.readouterr().err


def test_missing_config_file_and_bad_port(tmp_path, capsys):
    assert cli.main(["router", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err
    assert cli.main(["router", "--worker", "http://127.0.0.1:1", "--port", "70000"]) == 2


def test_replay_json_on_a_shared_prompt_trace(tmp_path, capsys):
    code = cli.main(["router", "replay", TRACE, "--json", "--limit", "400", "--docs-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["k3_session", "round_robin", "least_load", "cache_aware"]
    assert all(r["requests"] == 400 for r in rows)
    assert (tmp_path / "router-replay-shared-prompt-300.png").stat().st_size > 1000
    text = (tmp_path / "router-bench.md").read_text()
    assert "<!-- replay:shared-prompt-300:begin -->" in text and "| k3_session |" in text
    # a second trace gets its own section; re-running one replaces its section in place
    assert cli.main(["router", "replay", str(DATA / "tool-agent-200.jsonl"), "--limit", "50",
                     "--docs-dir", str(tmp_path), "--section", "agents"]) == 0
    assert cli.main(["router", "replay", TRACE, "--limit", "50", "--docs-dir", str(tmp_path)]) == 0
    text = (tmp_path / "router-bench.md").read_text()
    assert text.count("<!-- replay:shared-prompt-300:begin -->") == 1 and "<!-- replay:agents:begin -->" in text


def test_replay_bad_input(tmp_path, capsys):
    assert cli.main(["router", "replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "trace not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    for line in ('{"timestamp": 0, "input_length": 10}', '{"timestamp": 0, "input_length": -3, "output_length": 1, '
                 '"hash_ids": []}', '[1, 2]', '{"timestamp": "soon", "input_length": 1, "output_length": 1, "hash_ids": []}'):
        bad.write_text(line + "\n")
        assert cli.main(["router", "replay", str(bad), "--no-write"]) == 2
        assert "bad.jsonl:1" in capsys.readouterr().err
    assert cli.main(["router", "replay", TRACE, "--workers", "0", "--no-write"]) == 2
    for bad, fragment in (("colour=red", "expected KEY=VALUE"), ("kv_barrier_s", "expected KEY=VALUE"),
                          ("kv_barrier_s=fast", "kv_barrier_s takes a float"),
                          ("max_predicted_ttft_s=-1", "max_predicted_ttft_s must be positive")):
        assert cli.main(["router", "replay", TRACE, "--no-write", "--policy", bad]) == 2
        assert fragment in capsys.readouterr().err


def test_replay_policy_overrides_change_our_policy_only(capsys):
    args = ["router", "replay", TRACE, "--json", "--no-write", "--limit", "300"]
    assert cli.main(args) == 0
    default = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert cli.main(args + ["--policy", "max_predicted_ttft_s=0.05", "--policy", "learn_prefill_tps=false"]) == 0
    gated = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert gated["k3_session"]["rejected"] > 0 == default["k3_session"]["rejected"]
    assert gated["cache_aware"] == default["cache_aware"]


def test_make_trace_bad_input(tmp_path, capsys):
    assert cli.main(["router", "make-trace", "tool-agent", "--out", str(tmp_path / "t.jsonl"), "--sessions", "0"]) == 2
    assert "--sessions must be positive" in capsys.readouterr().err
    assert cli.main(["router", "make-trace", "shared-prompt", "--out", str(tmp_path / "t.jsonl"),
                     "--arrival-gap", "-1"]) == 2
    assert cli.main(["router", "make-trace", "shared-prompt", "--out", str(tmp_path / "no" / "t.jsonl")]) == 2
    assert "cannot write" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["router", "make-trace", "banana", "--out", str(tmp_path / "t.jsonl")])
    assert info.value.code == 2
