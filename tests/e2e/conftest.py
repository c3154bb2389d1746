"""One float32 tiny-K3 server shared by the end-to-end tests of this folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from k3_sglang.serving.process import K3ServerProcess

CHUNK = 64  # chunked-prefill size: prompts longer than this cross KDA chunk boundaries

# The reference forward runs in this process beside the server: with both using OpenMP threads
# on 2 cores, spin-waiting makes the (tiny, overhead-bound) reference orders of magnitude slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from k3_sglang.serving.cli import ensure_tiny_checkpoint
    from k3_sglang.serving.settings import ServeSettings

    return ensure_tiny_checkpoint(ServeSettings.from_env())


@pytest.fixture(scope="session")
def server(tiny_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc = K3ServerProcess(["--model-path", str(tiny_dir), "--dtype", "float32", "--chunked-prefill-size", str(CHUNK),
                            "--max-total-tokens", "8192"], log, env={"K3_MAX_N": "16"})
    proc.start(timeout_s=float(os.environ.get("K3_TEST_STARTUP_S", "400")))
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def reference(tiny_dir):
    from k3_sglang.config import K3Config
    from tests.utils.reference_k3 import ReferenceK3, load_reference_tensors

    return ReferenceK3(K3Config.from_json(tiny_dir), load_reference_tensors(tiny_dir))



@pytest.fixture(scope="session")
def reference_outputs(reference) -> list[list[int]]:
    """Reference greedy continuations (full recompute per token) of reference_prompts(), computed once."""
    from tests.e2e.reference_checks import REFERENCE_NEW_TOKENS, reference_prompts

    return [reference.greedy(ids, REFERENCE_NEW_TOKENS) for ids in reference_prompts()]
