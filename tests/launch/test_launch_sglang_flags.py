"""Every flag the launchers pass to `k3 serve` exists in SGLang 0.5.23's ServerArgs."""

from __future__ import annotations

import argparse

import pytest
from sglang.srt import server_args

from launch_helpers import RENDERED, scripts, serve_commands

SERVE_OWN_FLAGS = {"--model-path"}  # k3 serve's own flag (also an SGLang flag)


@pytest.fixture(scope="module")
def sglang_options() -> set[str]:
    from k3_sglang.dcp_mla import add_backend_choice

    add_backend_choice()  # what our k3_dcp_mla plugin does in every SGLang process before it parses arguments
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    return {s for action in parser._actions for s in action.option_strings}


def _lws_commands() -> list[list[str]]:
    import yaml

    docs = [d for d in yaml.safe_load_all(RENDERED["agent-100k"]["k3-agent-100k-lws.yaml"]) if d]
    return [t["spec"]["containers"][0]["command"] for d in docs if d["kind"] == "LeaderWorkerSet"
            for t in d["spec"]["leaderWorkerTemplate"].values() if isinstance(t, dict)]


def test_rendered_flags_exist_in_server_args(sglang_options):
    commands = [c for _, text in scripts() for c in serve_commands(text)] + _lws_commands()
    assert len(commands) >= 20
    used = {w for c in commands for w in c[2:] if w.startswith("--")}
    assert {"--dcp-size", "--pp-size", "--nnodes", "--node-rank", "--dist-init-addr", "--disaggregation-mode",
            "--mamba-full-memory-ratio"} <= used
    unknown = sorted(used - sglang_options - SERVE_OWN_FLAGS)
    assert not unknown, f"flags SGLang 0.5.23 does not know: {unknown}"


def test_flag_values_parse_with_server_args(sglang_options):
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    for _, text in scripts():
        for command in serve_commands(text):
            words = [w.replace("$MODEL_PATH", "/models/k3").replace("${NODES[0]}", "h0")
                     .replace("${NODE_ADDRS[0]}", "h0") for w in command[2:]]
            words = [w for w in words if not (w.startswith("${") and w.endswith("[@]}"))]  # loopback's arrays
            if "--model-path" not in words:  # loopback: k3 serve's default checkpoint (or MODEL_ARGS)
                words += ["--model-path", "/models/k3"]
            words = [w if not w.startswith("$((") else "30000" for w in words]  # loopback's port arithmetic
            words = [w if "${" not in w else "h0:5000" for w in words]
            args, extra = parser.parse_known_args(words)
            assert not extra, extra
            assert args.tp_size >= 1
