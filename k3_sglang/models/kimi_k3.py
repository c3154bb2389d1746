"""SGLang entry module: K3 served by SGLang, registered through SGLANG_EXTERNAL_MODEL_PACKAGE.

`k3 serve` sets SGLANG_EXTERNAL_MODEL_PACKAGE=k3_sglang.models, so SGLang's ModelRegistry
registers the classes in `EntryClass` under the checkpoint's architecture names and they
override SGLang's built-in K3 classes in that process only (plain `sglang serve` keeps its own).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.loader.weights import K3WeightLoader
from k3_sglang.model.decoder import K3Model


def _k3_config(hf_config) -> K3Config:
    data = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
    return K3Config.from_hf(data)


class KimiK3ForConditionalGeneration(nn.Module):
    """K3 text model (the vision tower is skipped); MLA latents in SGLang's KV pool, KDA state in its mamba pool."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        from sglang.srt.layers.logits_processor import LogitsProcessor

        self.config = config
        self.k3 = _k3_config(config)
        self.model = K3Model(self.k3)
        self.lm_head = nn.Linear(self.k3.hidden_size, self.k3.vocab_size, bias=False)
        text_config = getattr(config, "text_config", config)
        self.logits_processor = LogitsProcessor(config=text_config)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, input_embeds=None,
                inputs_embeds=None, pp_proxy_tensors=None, get_embedding: bool = False, **_):
        embeds = input_embeds if input_embeds is not None else inputs_embeds
        hidden = self.model(input_ids, forward_batch, embeds)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        loader = K3WeightLoader(self)
        loader.load(weights)
        loader.finish()


class KimiK3LinearForCausalLM(KimiK3ForConditionalGeneration):
    """Text-only export name of the same model."""


EntryClass = [KimiK3ForConditionalGeneration, KimiK3LinearForCausalLM]
