"""K3_CSV with a draft model (K3_SPEC_DRAFTER=checkpoint) end to end on CPU: lossless against no-spec.

The draft is the tiny random DSpark-style checkpoint (k3_sglang/tooling/spec/tiny_draft.py) with its confidence
head's bias at +8 (confidence ~1), so the compact planner verifies its drafts every step: the server must capture the
target's hidden states at every root (spec/root_capture.py), run the draft on them and verify its chains, and stay
token-identical to conftest.py's float32 no-spec server at concurrency 1 and with a batch at once (small: 1 prompt
alone, 3 at once, 8 new tokens, 90-130 s here with the server start; full: 3 alone, 6 at once, 16 tokens). All of it
is in the slow tier since 2026-12-06, to keep the default run inside CI's budget; the default tier keeps the unit
tests (tests/spec/test_checkpoint_drafter.py: the planner reading the confidence head, root capture and the seams of
SGLang's K3 it uses). Random drafts are rejected (nearly) always, so this checks the capture and the verify path
for losslessness, not acceptance. The model is SGLang's own K3 on k3_cpu.
"""
from __future__ import annotations

import pytest

from k3_sglang.serving.process import K3ServerProcess
from k3_sglang.tooling.spec.tiny_draft import write_tiny_draft
from tests.e2e.test_spec_serve import PROMPTS, SAME_AS_REFERENCE, _generate, _records

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
SMALL = (PROMPTS[:1], PROMPTS[3:6], 8)  # (alone, at once, new tokens)
FULL = (PROMPTS[:3], PROMPTS[3:9], 16)


def _draft_server(tiny_dir, work, env_extra=None):
    draft = write_tiny_draft(work / "draft", confidence_bias=8.0)
    record = work / "steps.jsonl"
    env = {"K3_SPEC_DRAFTER": "checkpoint", "K3_SPEC_DRAFT_PATH": str(draft), "K3_SPEC_VERIFY_MODE": "compact",
           "K3_SPEC_RECORD": str(record), **(env_extra or {})}
    proc = K3ServerProcess(["--model-path", str(tiny_dir), *SAME_AS_REFERENCE, "--speculative-algorithm", "K3_CSV",
                            "--speculative-num-draft-tokens", "8"], work / "serve.log", env=env)
    return proc.start(timeout_s=600), record


def _outputs(url: str, case) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy outputs of case's prompts one by one, then of its batch prompts all at once."""
    import concurrent.futures

    alone, batch, n = case
    single = [_generate(url, p, n)["output_ids"] for p in alone]
    with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
        return single, [r["output_ids"] for r in pool.map(lambda p: _generate(url, p, n), batch)]


def _check_drafted(steps: list[dict]) -> None:
    """The draft really proposed: verify steps carrying drafts, some of several requests."""
    verify = [s for s in steps if s["kind"] == "verify"]
    assert verify, "the checkpoint drafter never drafted (no root hidden states captured?)"
    assert all(s["drafted"] > 0 for s in verify)
    assert any(s["n_reqs"] > 1 for s in verify), "no verify step of several requests"


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(SMALL, id="small"), pytest.param(FULL, id="full")])
def test_checkpoint_drafter_lossless(tiny_dir, server, tmp_path_factory, case):
    reference = _outputs(server.url, case)
    proc, record = _draft_server(tiny_dir, tmp_path_factory.mktemp("spec-draft"))
    try:
        assert _outputs(proc.url, case) == reference
    finally:
        proc.stop()
    _check_drafted(_records(record))
