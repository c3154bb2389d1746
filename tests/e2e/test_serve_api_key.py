"""`k3 serve --api-key` (SGLang's option, passed through): unauthenticated requests are refused."""

from __future__ import annotations

import httpx
import openai
import pytest

from k3_sglang.serving.process import K3ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_api_key_protects_the_openai_endpoints(tiny_dir, tmp_path):
    args = ["--model-path", str(tiny_dir), "--api-key", "sekret", "--max-total-tokens", "4096"]
    with K3ServerProcess(args, tmp_path / "serve.log") as server:
        body = {"model": "default", "prompt": "hi", "max_tokens": 2}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 401
        wrong = httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"}, timeout=60)
        assert wrong.status_code == 401
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sekret", max_retries=0, timeout=120)
        assert client.completions.create(**body).usage.completion_tokens == 2
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="default", prompt="x", n=1000)
