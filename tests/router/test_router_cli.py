"""`k3 router` and `k3 router replay` command lines, including bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3_sglang import cli
from k3_sglang.router.cli import build_serve_config
from k3_sglang.router.config import ConfigError, load_config_file

# ../shared/ sits beside the checkout (on dev machines and in CI)
TRACE = str(Path(__file__).resolve().parents[3] / "shared" / "data" / "mooncake-synthetic-trace.jsonl")


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


def test_replay_json_on_the_public_trace(tmp_path, capsys):
    code = cli.main(["router", "replay", TRACE, "--json", "--limit", "400", "--docs-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["k3_session", "round_robin", "least_load", "cache_aware"]
    assert all(r["requests"] == 400 for r in rows)
    assert (tmp_path / "router-replay.png").stat().st_size > 1000
    assert "| k3_session |" in (tmp_path / "router-bench.md").read_text()


def test_replay_bad_input(tmp_path, capsys):
    assert cli.main(["router", "replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "trace not found" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10}\n')
    assert cli.main(["router", "replay", str(bad), "--no-write"]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert cli.main(["router", "replay", TRACE, "--workers", "0", "--no-write"]) == 2
