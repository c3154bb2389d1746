"""SGLang's own HTTP app and OpenAI serving layer in front of a scripted engine (tests only).

    python -m tests.utils.scripted_engine --port P --model-path DIR --outputs OUTPUTS.json

Everything above the engine is the real thing: SGLang's FastAPI app and routes, `OpenAIServingChat` /
`OpenAIServingCompletion` with the `kimi_k3` reasoning and tool-call parsers and SGLang's kimi_k3 chat encoder, on
the ServerArgs `k3 serve` composes for the tiny checkpoint, the tiny checkpoint's own tokenizer and model config,
and our request guard installed as `k3_sglang.serving.launch` installs it. Only the TokenizerManager is replaced:
its `generate_request` normalises the request as SGLang's does, then "generates" a fixed completion (OUTPUTS.json:
name -> XTML text; the request header `X-K3-Output` picks one, default `plain`), emulating the scheduler and
detokenizer: the text is tokenized, stopped at the first stop string (trimmed) or at max_new_tokens, and decoded with
the request's skip_special_tokens / spaces_between_special_tokens; streams arrive in chunks of a few tokens, cumulative
or incremental as SGLang's `incremental_streaming_output` says.

GET /k3_test/requests lists what reached the engine: {"path", "sequences"} per request (sequences = prompts x
parallel samples after SGLang's normalisation), so a test can compare the guard's count with SGLang's.
"""
from __future__ import annotations

import argparse
import json
import os
from types import SimpleNamespace

STREAM_CHUNK_TOKENS = 3


def _stop_strings(params: dict) -> list[str]:
    stop = params.get("stop") or []
    return [stop] if isinstance(stop, str) else list(stop)


class ScriptedEngine:
    """The TokenizerManager surface SGLang's OpenAI serving layer and /generate route use."""

    def __init__(self, server_args, tokenizer, model_config, outputs: dict[str, str]):
        self.server_args, self.tokenizer, self.model_config = server_args, tokenizer, model_config
        self.model_path, self.served_model_name, self.processor = server_args.model_path, "default", None
        self.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0)
        self.outputs = outputs
        self.requests: list[dict] = []

    def config_value(self, name: str):
        from sglang.srt.runtime_context import get_context

        return get_context().config_leaf(name)

    def create_abort_task(self, obj):
        return None

    def _completion(self, name: str, params: dict) -> tuple[list[int], list[str], dict]:
        """(token ids, decoded text after each chunk, finish_reason) of one scripted sequence."""
        ids = self.tokenizer.encode(self.outputs[name], add_special_tokens=False)
        limit = params.get("max_new_tokens")
        finish = {"type": "stop", "matched": None}

        def decode(part):
            return self.tokenizer.decode(part, skip_special_tokens=params.get("skip_special_tokens", True),
                                         spaces_between_special_tokens=params.get("spaces_between_special_tokens",
                                                                                  True))

        for end in range(1, len(ids) + 1):
            text = decode(ids[:end])
            hits = [(text.find(s), s) for s in _stop_strings(params) if s in text]
            if hits:
                ids, finish = ids[:end], {"type": "stop", "matched": min(hits)[1]}
                break
            if limit is not None and end >= limit:
                ids, finish = ids[:end], {"type": "length", "length": limit}
                break
        texts = []
        for end in list(range(STREAM_CHUNK_TOKENS, len(ids), STREAM_CHUNK_TOKENS)) + [len(ids)]:
            text = decode(ids[:end])
            matched = finish.get("matched")
            if isinstance(matched, str) and matched in text:
                text = text[:text.find(matched)]
            texts.append(text)
        return ids, texts, finish

    def _meta(self, rid: str, n_ids: int, finish: dict | None) -> dict:
        return {"id": rid, "finish_reason": finish, "prompt_tokens": 8, "weight_version":
                self.config_value("weight_version"), "num_retractions": 0, "reasoning_tokens": 0,
                "completion_tokens": n_ids, "cached_tokens": 0}

    async def generate_request(self, obj, request=None):
        from sglang.srt.runtime_context import get_serving

        obj.normalize_batch_and_arguments()
        rids = [obj.rid] if obj.is_single else list(obj.rid)
        params = [obj.sampling_params] if obj.is_single else list(obj.sampling_params)
        path = request.url.path if request is not None else ""
        first = obj.input_ids if obj.is_single else (obj.input_ids or [None])[0]
        prompt = self.tokenizer.decode(first, skip_special_tokens=False) if first else str(obj.text)
        self.requests.append({"path": path, "sequences": len(rids), "prompt": prompt})
        name = request.headers.get("x-k3-output", "plain") if request is not None else "plain"
        runs = [self._completion(name, p) for p in params]
        if not getattr(obj, "stream", False):
            outs = [{"text": texts[-1], "output_ids": ids, "meta_info": self._meta(rid, len(ids), finish), "index": i}
                    for i, (rid, (ids, texts, finish)) in enumerate(zip(rids, runs))]
            yield outs[0] if obj.is_single else outs
            return
        incremental = get_serving().incremental_streaming_output
        for i, (rid, (ids, texts, finish)) in enumerate(zip(rids, runs)):
            previous = ""
            for k, text in enumerate(texts):
                last = k == len(texts) - 1
                n_ids = len(ids) if last else (k + 1) * STREAM_CHUNK_TOKENS
                yield {"text": text[len(previous):] if incremental else text, "output_ids": ids[:n_ids],
                       "meta_info": self._meta(rid, n_ids, finish if last else None), "index": i}
                previous = text


def build_app(model_path: str, outputs: dict[str, str], port: int):
    """SGLang's app with the serving layer on a ScriptedEngine and our guard (the `k3 serve` configuration)."""
    os.environ.setdefault("SGLANG_PLATFORM", "k3_cpu")
    from pathlib import Path

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    from k3_sglang.serving.cli import sglang_argv
    from k3_sglang.serving.launch import install_guard
    from k3_sglang.serving.settings import ServeSettings

    load_plugins()
    server_args = prepare_server_args(sglang_argv(Path(model_path), "127.0.0.1", port, [], on_cpu=True))
    publish(server_args, role="tokenizer")
    engine = ScriptedEngine(server_args, get_tokenizer(model_path), ModelConfig.from_server_args(server_args),
                            outputs)
    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=engine, model_path=model_path, chat_template=None,
                                   completion_template=None)
    app = http_server.app
    http_server.set_global_state(http_server._GlobalState(tokenizer_manager=engine, template_manager=templates,
                                                          scheduler_info={}))
    app.state.openai_serving_chat = OpenAIServingChat(engine, templates)
    app.state.openai_serving_completion = OpenAIServingCompletion(engine, templates)
    app.add_api_route("/k3_test/requests", lambda: engine.requests, methods=["GET"])
    install_guard(app, ServeSettings.from_env())
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.utils.scripted_engine")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--outputs", required=True, help="JSON: name -> completion text")
    args = parser.parse_args()
    with open(args.outputs) as fh:
        outputs = json.load(fh)
    import uvicorn

    app = build_app(args.model_path, outputs, args.port)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
