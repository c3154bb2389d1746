"""A tiny Llama-shaped checkpoint written offline (random float32 weights, the tiny K3's small BPE tokenizer): a
non-K3 model for the tests that show k3-sglang leaves plain SGLang alone."""
from __future__ import annotations

from pathlib import Path

BPE_RANKS = 512  # the tokenizer has BPE_RANKS + 256 ids


def write_tiny_llama(out_dir: Path, seed: int = 0) -> Path:
    """config.json, model.safetensors and the tokenizer files of a 2-layer Llama (hidden 64, GQA 4/2 heads)."""
    import torch
    import transformers

    from k3_sglang.tiny.checkpoint import chat_template
    from k3_sglang.tiny.tokenizer import write_tokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out_dir, BPE_RANKS, chat_template())
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=BPE_RANKS + 256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                                      tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).to(torch.float32).save_pretrained(out_dir, safe_serialization=True)
    return out_dir
