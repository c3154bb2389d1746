"""The MLA attention backend a plan renders (k3_sglang/plan/attention.py): k3_dcp_mla for DCP off Blackwell, SGLang's
own choice elsewhere, and the plans SGLang 0.5.23 would refuse at start refused by `k3 plan` and `k3 launch render`
with the reason."""
from __future__ import annotations

import pytest

from k3_sglang.cli import main
from k3_sglang.launch.golden import EXAMPLES_DIR
from k3_sglang.plan import PlanError
from k3_sglang.plan.attention import attention_backend, backend_args

H200_DCP = ["--system", "h200-16x", "--tp", "16", "--dcp", "8", "--ep", "16"]


@pytest.mark.parametrize("choice,dcp,blackwell,want", [
    ("auto", 8, False, "k3_dcp_mla"),   # Hopper DCP: our backend
    ("auto", 1, False, None),           # no DCP: SGLang's own
    ("auto", 8, True, None),            # Blackwell keeps SGLang's cutedsl_mla
    ("k3_dcp_mla", 8, True, "k3_dcp_mla"),  # ... unless asked
    ("k3_dcp_mla", 1, False, "k3_dcp_mla"),
    ("cutedsl_mla", 8, True, None),     # SGLang's own DCP pick, no flag needed
    ("cutedsl_mla", 1, True, "cutedsl_mla"),
    ("sglang", 8, True, None),
])
def test_backend_choice(choice, dcp, blackwell, want):
    assert attention_backend(choice, dcp, blackwell, "bf16", "g") == want


@pytest.mark.parametrize("choice,dcp,kv,fragment", [
    ("sglang", 8, "bf16", "only through the cutedsl_mla decode backend"),
    ("cutedsl_mla", 8, "bf16", "runs on Blackwell (SM100) only"),
    ("cutedsl_mla", 1, "bf16", "runs on Blackwell (SM100) only"),
    ("auto", 8, "fp8_e4m3", "bf16 latent cache"),
    ("flashmla", 8, "bf16", "expected one of"),
])
def test_refused_choices_name_the_reason(choice, dcp, kv, fragment):
    with pytest.raises(PlanError) as info:
        attention_backend(choice, dcp, False, kv, "unified group")
    assert info.value.constraint == "attention-backend" and fragment in str(info.value)


def test_k3_dcp_mla_runs_decode_eagerly():
    assert backend_args("k3_dcp_mla") == ["--attention-backend", "k3_dcp_mla", "--cuda-graph-backend-decode",
                                          "disabled"]
    assert backend_args(None) == []


def test_h200_dcp_plan_names_the_backend(capsys):
    assert main(["plan", *H200_DCP, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"attention_backend": "k3_dcp_mla"' in out


def test_h200_dcp_plan_without_k3_dcp_mla_is_refused_by_plan_and_render(tmp_path, capsys):
    assert main(["plan", *H200_DCP, "--attention-backend", "sglang"]) == 2
    assert "refuses this plan at start" in capsys.readouterr().err
    assert main(["launch", "render", *H200_DCP, "--attention-backend", "sglang", "--out", str(tmp_path)]) == 2
    assert "refuses this plan at start" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert main(["launch", "render", *H200_DCP, "--attention-backend", "cutedsl_mla", "--out", str(tmp_path)]) == 2
    assert "Blackwell (SM100) only" in capsys.readouterr().err


def test_rendered_h200_long_context_example_names_the_backend():
    script = (EXAMPLES_DIR / "long-context" / "k3-long-context.sh").read_text()
    serve = [line for line in script.splitlines() if line.strip().startswith("start k3 serve")]
    assert len(serve) == 2
    for line in serve:
        assert "--dcp-size 8" in line
        assert "--attention-backend k3_dcp_mla --cuda-graph-backend-decode disabled" in line


def test_blackwell_rack_render_keeps_sglangs_backend():
    sbatch = (EXAMPLES_DIR / "agent-100k" / "k3-agent-100k.sbatch").read_text()
    assert "--dcp-size 8" in sbatch and "--attention-backend" not in sbatch
