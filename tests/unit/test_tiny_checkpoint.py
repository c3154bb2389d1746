"""`k3 make-tiny`: deterministic checkpoint, K3 control tokens, the XTML chat template, the loader."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from k3_sglang.config import K3Config, preset
from k3_sglang.tiny.checkpoint import write_tiny_checkpoint

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": 'Weather in "Paris"?'},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Paris", "days": 3, "metric": True}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]
EXPECTED_WITH_TOOLS = (
    '<|open|>message role="system" type="tool-declare"<|sep|># Tools\n'
    "Here are the available tools, described in JSONSchema.\n```json\n"
    '[{"function":{"description":"Weather","name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},'
    '"required":["city"],"type":"object"}},"type":"function"}]\n```<|close|>message<|sep|><|end_of_msg|>'
    '<|open|>message role="system"<|sep|>Be brief.<|close|>message<|sep|><|end_of_msg|>'
    '<|open|>message role="user"<|sep|>Weather in "Paris"?<|close|>message<|sep|><|end_of_msg|>'
    '<|open|>message role="assistant"<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
    '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
    '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
    '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>'
    '<|open|>argument key="metric" type="boolean"<|sep|>true<|close|>argument<|sep|>'
    "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    '<|open|>message role="tool" tool_call_id="c1"<|sep|>sunny<|close|>message<|sep|><|end_of_msg|>'
    '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


def test_checkpoint_is_deterministic(tiny, tmp_path):
    again = write_tiny_checkpoint(tmp_path / "again")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert hashlib.sha256((tiny / name).read_bytes()).digest() == hashlib.sha256((again / name).read_bytes()).digest()


def test_checkpoint_layout(tiny):
    from safetensors import safe_open

    hf = json.loads((tiny / "config.json").read_text())
    assert hf["architectures"] == ["KimiK3ForConditionalGeneration"]
    assert hf["text_config"]["quantization_config"]["format"] == "mxfp4-pack-quantized"
    assert K3Config.from_json(tiny) == K3Config.from_hf(hf, name=tiny.name)
    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        packed = f.get_tensor("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed")
    assert all(k.startswith("language_model.") for k in keys)
    assert packed.dtype == torch.uint8 and packed.shape == (64, 32)


def test_control_tokens_at_k3_offsets(tokenizer):
    base = preset("k3-tiny").vocab_size - 256
    for offset, token in {0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
                          9: "[EOT]", 21: "<|media_pad|>", 255: "[PAD]"}.items():
        assert tokenizer.convert_tokens_to_ids(token) == base + offset
    assert tokenizer.eos_token_id == preset("k3-tiny").tokens.eos
    for word in ("response", "message", "think", "tools"):
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1
    assert tokenizer.decode(tokenizer.encode("Hello, world!", add_special_tokens=False)) == "Hello, world!"


def test_chat_template_renders_xtml_with_tools(tokenizer):
    rendered = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert rendered == EXPECTED_WITH_TOOLS


def test_chat_template_non_thinking_prompt(tokenizer):
    rendered = tokenizer.apply_chat_template(MESSAGES[1:2], tokenize=False, add_generation_prompt=True, thinking=False)
    assert rendered == ('<|open|>message role="user"<|sep|>Weather in "Paris"?<|close|>message<|sep|><|end_of_msg|>'
                        '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>')


def test_sglang_kimi_k3_tool_parser_reads_the_rendered_call():
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.kimik3_detector import KimiK3Detector

    start = EXPECTED_WITH_TOOLS.index("<|open|>tools<|sep|>")
    end = EXPECTED_WITH_TOOLS.index("<|close|>tools<|sep|>") + len("<|close|>tools<|sep|>")
    result = KimiK3Detector().detect_and_parse(EXPECTED_WITH_TOOLS[start:end], [Tool(**TOOLS[0])])
    assert [c.name for c in result.calls] == ["get_weather"]
    assert json.loads(result.calls[0].parameters) == {"city": "Paris", "days": 3, "metric": True}


def test_vision_tower_is_a_miniature(tiny):
    """SGLang's K3 class builds its MoonViT tower on every rank from config.json's vision_config (SGLang's default:
    ~401M parameters, 1.6 GB per rank in float32); the tiny checkpoint's must stay small."""
    from sglang.srt.configs.kimi_k3 import KimiK3Config
    from sglang.srt.models.kimi_k3_vl import KimiK3MultiModalProjector, KimiK3VisionTower

    vision = KimiK3Config(**json.loads((tiny / "config.json").read_text())).vision_config
    params = sum(p.numel() for m in (KimiK3VisionTower(vision), KimiK3MultiModalProjector(vision))
                 for p in m.parameters())
    assert 0 < params < 1_000_000, params
