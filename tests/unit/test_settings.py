"""Typed K3_* settings (k3_sglang/env_settings.py): one pydantic model per process kind (ServeSettings for `k3 serve`,
WorkerSettings with its K3_CSV section for SGLang's server processes), errors that name the variable, K3_SPEC_PRIOR
read into the served drafter, and no runtime module reading a K3_* variable by hand. Under 5 s."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from k3_sglang.worker_settings import WorkerSettings
from k3_sglang.serving.settings import ServeSettings
from k3_sglang.spec.drafters.calibrate import BetaBucketCalibrator, CalibratorConfig
from k3_sglang.spec.settings import SpecSettings

REPO = Path(__file__).resolve().parents[2]


def test_each_process_kind_parses_its_variables():
    serve = ServeSettings.from_env({"K3_MAX_N": "4", "K3_CACHE_DIR": "k3-cache", "K3_MODEL_IMPL": "portable"})
    assert (serve.max_n, serve.cache_dir) == (4, Path("k3-cache"))  # K3_MODEL_IMPL retired: `k3 serve` checks it
    worker = WorkerSettings.from_env({"K3_KV_READ_TRACE": "kv-trace.jsonl", "K3_SPEC_VERIFY_MODE": "static",
                                      "K3_SPEC_SEED": "7", "K3_SPEC_FORCE_VERIFY_LEN": "3", "K3_MAX_N": "not mine"})
    assert worker.kv_read_trace == Path("kv-trace.jsonl")
    assert WorkerSettings.from_env({"K3_KV_READ_TRACE": " "}).kv_read_trace is None
    assert (worker.spec.verify_mode, worker.spec.seed, worker.spec.force_verify_len) == ("static", 7, 3)
    assert WorkerSettings.from_env({}) == WorkerSettings()  # unset and empty keep the defaults


@pytest.mark.parametrize("kind,env,message", [
    (ServeSettings, {"K3_MAX_N": "zero"}, "K3_MAX_N must be an integer, got 'zero'"),
    (ServeSettings, {"K3_MAX_N": "0"}, "K3_MAX_N must be >= 1, got 0"),
    (WorkerSettings, {"K3_SPEC_DRAFTER": "psychic"}, "K3_SPEC_DRAFTER must be one of lookup, controlled"),
    (WorkerSettings, {"K3_SPEC_LOOKUP_WINDOW": "-1"}, "K3_SPEC_LOOKUP_WINDOW must be >= 0, got -1"),
    (WorkerSettings, {"K3_SPEC_SEED": "1.5"}, "K3_SPEC_SEED must be an integer, got '1.5'"),
])
def test_bad_values_name_the_variable(kind, env, message):
    with pytest.raises(ValueError) as info:
        kind.from_env(env)
    assert message in str(info.value)


def test_settings_are_frozen_and_closed():
    settings = ServeSettings()
    with pytest.raises(ValidationError):
        settings.max_n = 3
    with pytest.raises(ValidationError):
        ServeSettings(max_nn=3)


def _saved_prior(path: Path) -> dict:
    cal = BetaBucketCalibrator(CalibratorConfig(forgetting=1.0))
    for _ in range(40):
        cal.update([(0, 1, 0, 1), (1, 1, 0, 1)], n_verified=2, n_accepted=1)
    cal.save(str(path))
    return json.loads(path.read_text())


def test_spec_prior_is_read_into_the_served_drafter(tmp_path):
    from k3_sglang.spec.policy import StepPolicy

    saved = _saved_prior(tmp_path / "prior.json")
    settings = SpecSettings.from_env({"K3_SPEC_PRIOR": str(tmp_path / "prior.json")}).ready()
    calibrator = StepPolicy(settings, gamma=4, vocab_size=64).drafter.calibrator
    assert calibrator.to_json() == saved
    fresh = StepPolicy(SpecSettings(), gamma=4, vocab_size=64).drafter.calibrator
    assert fresh.to_json()["buckets"] == [] and saved["buckets"] != []


def test_spec_prior_problems_are_refused_before_serving(tmp_path):
    with pytest.raises(ValueError, match="K3_SPEC_PRIOR: no such file"):
        SpecSettings(prior=str(tmp_path / "missing.json")).ready()
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="K3_SPEC_PRIOR: calibrator prior: expected a JSON object"):
        SpecSettings(prior=str(bad)).ready()


def _reads_k3_variable(node: ast.AST) -> bool:
    """os.environ.get("K3_..."), os.getenv("K3_..."), os.environ["K3_..."] (a read)."""
    def k3(arg):
        return isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("K3_")

    if isinstance(node, ast.Call) and node.args and k3(node.args[0]):
        return ast.unparse(node.func) in ("os.environ.get", "os.getenv", "environ.get")
    return (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and k3(node.slice)
            and ast.unparse(node.value) in ("os.environ", "environ"))


def test_only_the_settings_models_read_k3_variables():
    readers = []
    for folder in ("k3_sglang", "kernels", "parallel", "launch"):
        for path in (REPO / folder).rglob("*.py"):
            if "tooling" in path.parts or path.name == "env_settings.py":
                continue
            if any(_reads_k3_variable(node) for node in ast.walk(ast.parse(path.read_text()))):
                readers.append(str(path.relative_to(REPO)))
    assert readers == []
    assert _reads_k3_variable(ast.parse('os.environ.get("K3_X", "")').body[0].value)  # the check sees a read
