"""One deployment decision (k3_sglang/deployment.py): the command line parsed once by SGLang's parser, a `--config` YAML
seen exactly as the same flags, our defaults yielding to either, and the decision handed to the server processes in
K3_DEPLOYMENT, which the plugins read."""
from __future__ import annotations

import json
import os

import pytest

from k3_sglang.cli import main
from k3_sglang.serving.cli import compose, serving_env
from k3_sglang.deployment import ENV_VAR, Deployment, current, parse_sglang_argv

FLAGS = ["--tp-size", "2", "--dcp-size", "2", "--pp-size", "2", "--speculative-algorithm", "K3_CSV",
         "--disaggregation-mode", "prefill", "--enable-hierarchical-cache", "--chunked-prefill-size", "1024",
         "--dtype", "float32", "--dp-size", "2"]
YAML = """tp-size: 2
dcp-size: 2
pp-size: 2
speculative-algorithm: K3_CSV
disaggregation-mode: prefill
enable-hierarchical-cache: true
chunked-prefill-size: 1024
dtype: float32
dp-size: 2
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "server.yaml"
    path.write_text(YAML)
    return path


def test_a_config_file_is_seen_exactly_as_the_same_flags(config):
    from_flags = Deployment.from_argv(FLAGS)
    from_yaml = Deployment.from_argv(["--config", str(config)])
    assert from_yaml == from_flags  # every field, `given` included (the namespace is not compared)
    assert (from_yaml.tp, from_yaml.dcp, from_yaml.pp, from_yaml.dp) == (2, 2, 2, 2)
    assert from_yaml.k3_csv and from_yaml.pd and from_yaml.hicache and from_yaml.dtype == "float32"
    assert from_yaml.ranks == 4 and from_yaml.chunked_prefill_size == 1024
    assert {"tp_size", "speculative_algorithm", "chunked_prefill_size"} <= from_yaml.given
    assert "max_total_tokens" not in from_yaml.given
    # the command line wins over the file, as in SGLang
    assert Deployment.from_argv(["--config", str(config), "--tp", "1"]).tp == 1


def test_our_defaults_yield_to_a_config_file(config, tmp_path):
    """A default `k3 serve` adds on the command line would beat the user's YAML (SGLang: CLI > config), so a field the
    file sets gets none of ours: the server runs the file's value."""
    small = tmp_path / "small.yaml"
    small.write_text("chunked-prefill-size: 1024\nmax-total-tokens: 65536\nsleep-on-idle: true\n")
    user = Deployment.from_argv(["--config", str(small)], "k3_cpu", "/m")
    ours, served = compose(tmp_path, "127.0.0.1", 1, user)
    assert "--chunked-prefill-size" not in ours and "--max-total-tokens" not in ours and "--sleep-on-idle" not in ours
    assert "--attention-backend" in ours  # what the file leaves unset still gets our default
    server = parse_sglang_argv(ours + ["--config", str(small)])  # what SGLang's prepare_server_args reads
    assert server.chunked_prefill_size == 1024 and server.max_total_tokens == 65536
    assert served.chunked_prefill_size == 1024 and served.args.max_total_tokens == 65536
    # the KDA state pool is sized from the file's pool and chunk, not from our defaults
    from k3_sglang.serving.cli import cpu_state_slots

    assert ours[ours.index("--max-mamba-cache-size") + 1] == str(cpu_state_slots(served.args))
    assert cpu_state_slots(served.args) != cpu_state_slots(["--disable-overlap-schedule"])


def test_a_config_file_is_refused_as_the_same_flags(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(os, "execvpe", lambda *a: pytest.fail("no server may start"))
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    monkeypatch.delenv("K3_MODEL_IMPL", raising=False)
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tp-size: 16\nspeculative-algorithm: EAGLE\n")
    assert main(["serve", "--config", str(bad)]) == 2
    from_file = capsys.readouterr().err
    assert main(["serve", "--tp-size", "16", "--speculative-algorithm", "EAGLE"]) == 2
    from_flags = capsys.readouterr().err
    assert "--tp-size 16: tensor parallelism" in from_file and "--speculative-algorithm EAGLE" in from_file
    assert from_file == from_flags
    assert main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_the_server_environment_follows_a_config_file(config):
    """K3_CSV under PP needs SGLang's pipeline speculation relay: set from the file as from the flags (the raw
    command-line scans this replaces saw neither the file's --speculative-algorithm nor its --pp-size)."""
    env = serving_env(Deployment.from_argv(["--config", str(config)], "k3_cpu"))
    assert env["SGLANG_ENABLE_PP_SPEC"] == "1" and env["SGLANG_MAMBA_CONV_DTYPE"] == "float32"
    assert len(env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 4  # TP2 x PP2 ranks


def test_the_decision_reaches_the_server_processes(monkeypatch):
    d = Deployment.from_argv(["--tp-size", "2", "--dcp-size", "2"], "k3_cpu")
    env = serving_env(d)
    carried = Deployment.from_json(env[ENV_VAR])
    assert carried == d and carried.args is None
    assert json.loads(env[ENV_VAR])["platform"] == "k3_cpu" and "model" not in json.loads(env[ENV_VAR])
    assert Deployment.from_json('{"model": "sglang", "tp": 2}').tp == 2  # written before the portable model retired
    with pytest.raises(ValueError, match=ENV_VAR):
        Deployment.from_json('{"tp": 2, "nonsense": 1}')


@pytest.mark.parametrize("platform,active", [
    ("k3_cpu", {"sglang_cpu": True, "dcp_mla_gpu": False, "on_k3_cpu": True}),
    ("cuda", {"sglang_cpu": False, "dcp_mla_gpu": True, "on_k3_cpu": False}),
])
def test_plugins_decide_from_the_deployment(monkeypatch, platform, active):
    """Each plugin's "does this apply" reads K3_DEPLOYMENT, whatever else the environment inherited."""
    from k3_sglang import platform_hooks
    from k3_sglang.dcp_mla import plugin as dcp_plugin
    from k3_sglang.sglang_cpu import hooks as sglang_cpu_hooks
    from k3_sglang.spec.contract import contract_refusals

    monkeypatch.setenv(ENV_VAR, Deployment(platform=platform).to_json())
    stale = "cuda" if platform == "k3_cpu" else "k3_cpu"  # an inherited export that says the opposite
    monkeypatch.setenv("SGLANG_PLATFORM", stale)
    assert current().platform == platform
    got = {"sglang_cpu": sglang_cpu_hooks.active(), "dcp_mla_gpu": dcp_plugin.active(),
           "on_k3_cpu": platform_hooks.on_k3_cpu()}
    assert got == active

    class Args:
        model_path = None
        attention_backend = "triton"
        decode_attention_backend = None

    assert any("--attention-backend triton" in r for r in contract_refusals(Args()))  # on every platform


def test_no_deployment_where_k3_is_not_in_play():
    assert current({}) is None
    assert current({"SGLANG_PLATFORM": "k3_cpu"}).sglang_cpu  # a k3_cpu server started by hand
    assert current({"SGLANG_EXTERNAL_MODEL_PACKAGE": "k3_sglang.models"}) is None  # the retired portable package
    assert current({"K3_SERVE_HOOKS": "1"}).platform == "cuda"


def test_the_launcher_checks_the_deployment_it_was_handed(monkeypatch, tmp_path, capsys):
    """serving/launch.py picks the limits table from K3_DEPLOYMENT (here the k3_cpu platform, no SGLANG_PLATFORM
    exported), and re-checks SGLang's prepared ServerArgs, a --config file included."""
    from k3_sglang.serving import launch

    monkeypatch.setenv(ENV_VAR, Deployment(platform="k3_cpu").to_json())
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    monkeypatch.setattr("sglang.srt.plugins.load_plugins", lambda: None)
    config = tmp_path / "server.yaml"
    config.write_text("pp-size: 16\ncuda-graph-backend-decode: disabled\ncuda-graph-backend-prefill: disabled\n")
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--model-path", str(tmp_path), "--config", str(config)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "SGLang's K3 cannot serve this configuration on the k3_cpu platform" in err and "--pp-size 16" in err
