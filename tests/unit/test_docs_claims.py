"""Docs that say what the code does: the kernel dispatch table (kernels.md) matches the ops the runtime calls; no doc
says SGLang's K3 refuses on CPU what its limits table serves; every K3_* variable the docs name is read by a
settings model (or is one of a few named non-settings) and every settings variable is documented; `k3 bench serve`
writes no figure it did not measure. Static, under 2 s."""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from k3_sglang.hicache.settings import HiCacheSettings
from k3_sglang.serving.kv_events_config import KvEventsSettings
from k3_sglang.serving import sglang_cpu_limits
from k3_sglang.serving.retention import RetentionSettings
from k3_sglang.serving.settings import ServeSettings
from k3_sglang.spec.settings import SpecSettings
from k3_sglang.serving.step_timing import StepTimingSettings
from k3_sglang.sglang_guard import GuardSettings
from k3_sglang.worker_settings import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# K3_ names in the docs that are not settings: the algorithm, the GPU test switch, the rendered scripts' variables
# and the switch `k3 serve` sets for its own SGLang plugins; the retired model switch `k3 serve` still answers; the
# stage-trace folder `k3 bench pp-prefill` hands its servers
NOT_SETTINGS = {"K3_CSV", "K3_KERNEL_TESTS_ON_GPU", "K3_SERVE_ARGS", "K3_ROUTER_ARGS", "K3_SPEC_", "K3_SERVE_HOOKS",
                "K3_DEPLOYMENT", "K3_MODEL_IMPL", "K3_STAGE_TRACE"}


def _dispatch_calls() -> set[str]:
    called = set()
    for folder in ("k3_sglang", "parallel"):
        for path in (REPO / folder).rglob("*.py"):
            if "tooling" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "dispatch"):
                    called.add(node.func.attr)
    return called


def test_kernels_md_dispatch_table_matches_the_calls():
    text = (REPO / "docs" / "kernels.md").read_text()
    table = text.split("| dispatch op | called by |", 1)[1].split("\n\n", 1)[0]
    documented, uncalled = set(), set()
    for row in table.splitlines()[2:]:
        ops = set(re.findall(r"`(\w+)`", row.split("|")[1]))
        (uncalled if row.split("|")[2].strip().startswith("nothing") else documented).update(ops)
    assert documented == _dispatch_calls()
    assert not uncalled & _dispatch_calls()
    assert "mla_dcp" in documented  # the k3_dcp_mla / k3_cpu_mla backends run through dispatch


STALE_CPU_CLAIMS = ("SGLang's K3 refuses DCP", "K3_MODEL_IMPL=sglang k3 serve", "SUPPORTED_SPECULATIVE_ALGORITHMS is empty",
                    "the portable model is the CPU default", "k3_sglang/model/")


def test_no_doc_says_sglangs_k3_refuses_on_cpu_what_it_serves():
    """The portable model has retired: no doc tells a user to pick a model, or that SGLang's K3 refuses on CPU what its
    table serves (DCP, K3_CSV, PD, HiCache are served)."""
    table = sglang_cpu_limits.limits()
    assert table.parallel["dcp_size"].supported >= 2 and "K3_CSV" in table.allowed["speculative_algorithm"].values
    assert "prefill" in table.allowed["disaggregation_mode"].values
    for path in DOCS:
        text = " ".join(path.read_text().split())
        assert not [c for c in STALE_CPU_CLAIMS if c in text], path.name


def _settings_variables() -> set[str]:
    names = set()
    for model in (ServeSettings, WorkerSettings, SpecSettings, KvEventsSettings, RetentionSettings, HiCacheSettings,
                  StepTimingSettings, GuardSettings):
        names |= {model.env_name(f) for f, info in model.model_fields.items() if info.annotation is not SpecSettings}
    return names


def test_documented_variables_are_read_and_settings_are_documented():
    documented = {name for path in DOCS for name in re.findall(r"\bK3_[A-Z0-9_]+", path.read_text())}
    settings = _settings_variables()
    assert "K3_SPEC_PRIOR" in settings and "K3_MAX_SEQUENCES" in settings
    assert documented - settings - NOT_SETTINGS == set()
    assert settings - documented == set()
    sources = " ".join(p.read_text() for folder in ("k3_sglang", "launch", "tests") for p in (REPO / folder).rglob("*.py"))
    assert all(name in sources for name in NOT_SETTINGS)


def test_bench_serve_report_holds_only_measured_figures(tmp_path):
    from k3_sglang.tooling.bench import serve

    args = argparse.Namespace(concurrency=32, new_tokens=128, repeats=3, serve_args=[], out=tmp_path / "r.md")
    serve._write_report(args, "| batch-1 decode (tok/s) | 12.3 |")
    prose = (tmp_path / "r.md").read_text().split("| measure |")[0]
    assert re.findall(r"([\d.]+)x? (?:tok/s|at \d+ concurrent)", prose) == ["50"]  # the goal only
    assert "Llama" not in prose and "Llama (hidden" not in (REPO / "docs" / "bench-serve.md").read_text()
