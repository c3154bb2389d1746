"""A small byte-level BPE tokenizer with K3's control-token layout, built with `tokenizers`.

Ids 0..767 are BPE ranks (with the XTML channel words as whole tokens, as in K3), ids
768..1023 the 256 control slots at K3's offsets (K3 puts them at 163584 + offset).
"""

from __future__ import annotations

import json
from pathlib import Path

# offset within the 256 control slots -> token (K3: id = 163584 + offset)
CONTROL_TOKENS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|end_of_msg|>", 3: "<|open|>", 4: "<|close|>", 5: "<|sep|>",
    9: "[EOT]", 18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>", 21: "<|media_pad|>",
    254: "[UNK]", 255: "[PAD]",
}
# XTML channel and attribute words are whole plain-text tokens in K3's vocabulary.
CHANNEL_WORDS = ["message", "response", "think", "tools", "call", "argument"]

_CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "An agent reads the repository, runs the tests and writes a patch.",
    "def add(a, b):\n    return a + b\n",
    "import json\nprint(json.dumps({\"city\": \"Paris\", \"days\": 3}))\n",
    "What is the weather in Paris today? It is sunny and warm.",
    "Kimi K3 serves long contexts with delta attention and latent attention layers.",
    "Hello! How can I help you today? Please describe the problem.",
    "for i in range(10):\n    total += i * i\n",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.71 -1 +2 = % / * ( ) [ ] { } < > ' \" : ; , .",
    "system user assistant tool role type key index string number boolean null object array",
]


def control_token(offset: int) -> str:
    return CONTROL_TOKENS.get(offset, f"<|reserved_token_{offset}|>")


def _corpus() -> list[str]:
    return [line for _ in range(40) for line in _CORPUS_LINES]


def build_tokenizer(bpe_ranks: int):
    """Train the BPE deterministically; return a `tokenizers.Tokenizer` of exactly bpe_ranks + 256 ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers import AddedToken

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_ranks - len(CHANNEL_WORDS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    filler = 0
    while tok.get_vocab_size() < bpe_ranks - len(CHANNEL_WORDS):
        tok.add_tokens([f"<|bpe_filler_{filler}|>"])
        filler += 1
    tok.add_tokens([AddedToken(w, single_word=False, normalized=False) for w in CHANNEL_WORDS])
    if tok.get_vocab_size() != bpe_ranks:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} BPE ids, expected {bpe_ranks}")
    tok.add_special_tokens([AddedToken(control_token(i), special=True, normalized=False) for i in range(256)])
    return tok


def write_tokenizer(out_dir: Path, bpe_ranks: int, chat_template: str) -> None:
    """Write tokenizer.json, tokenizer_config.json (with the chat template) and special_tokens_map.json."""
    tok = build_tokenizer(bpe_ranks)
    tok.save(str(out_dir / "tokenizer.json"))
    special = {"bos_token": "[BOS]", "eos_token": "<|end_of_msg|>", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 20,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
        **special,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
