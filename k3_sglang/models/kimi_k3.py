"""SGLang entry module: K3 served by SGLang, registered through SGLANG_EXTERNAL_MODEL_PACKAGE.

`k3 serve` sets SGLANG_EXTERNAL_MODEL_PACKAGE=k3_sglang.models, so SGLang's ModelRegistry
registers the classes in `EntryClass` under the checkpoint's architecture names and they
override SGLang's built-in K3 classes in that process only (plain `sglang serve` keeps its own).

Pipeline parallelism (`--pp-size N`) runs through SGLang's own PP scheduler: each rank builds and loads only the
layers SGLang's `get_pp_indices` gives it (SGLANG_PP_LAYER_PARTITION honoured), exposes them as
`start_layer`/`end_layer` (SGLang sizes the stage's KV and KDA pools from these) and hands the next rank the
same `hidden_states` + `attn_res_bank` proxy as SGLang's own K3 (`k3_sglang.parallel.pipeline`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from k3_sglang.config import K3Config
from k3_sglang.loader.weights import K3WeightLoader
from k3_sglang.model.decoder import K3Model
from k3_sglang.model.settings import worker_settings
from k3_sglang.parallel.pipeline import StageRange, describe_stage, pack_carry, unpack_carry
from k3_sglang.parallel.pipeline_trace import StageTrace

logger = logging.getLogger(__name__)


def _k3_config(hf_config) -> K3Config:
    """The checkpoint's own config.json when SGLang's config names its folder: on CPU SGLang pads the intermediate
    sizes of its copy so that every TP rank's block is a multiple of 32 (`configs/update_config.py`,
    `adjust_config_with_unaligned_cpu_tp`), which the portable layers must not inherit (the tensors are unpadded)."""
    from pathlib import Path

    path = getattr(hf_config, "_name_or_path", None)
    if path and (Path(path) / "config.json").is_file():
        cfg = K3Config.from_json(path)
    else:
        cfg = K3Config.from_hf(hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config))
    if cfg.quant.portable_problem():
        raise ValueError(cfg.quant.portable_problem())
    return cfg


def _pipeline_stage(num_layers: int) -> StageRange:
    """This rank's layers, from SGLang's own partition (the one its pool sizing uses on every rank)."""
    from sglang.srt.distributed.utils import get_pp_indices
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    start, end = get_pp_indices(num_layers, parallel.pp_rank, parallel.pp_size)
    return StageRange(start, end, num_layers)


def _tp_rank() -> int:
    from k3_sglang.model.parallel import ModelParallel

    return ModelParallel.current().tp.rank


class KimiK3ForConditionalGeneration(nn.Module):
    """K3 text model (the vision tower is skipped); MLA latents in SGLang's KV pool, KDA state in its mamba pool."""

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__()
        from sglang.srt.layers.logits_processor import LogitsProcessor

        self.config = config
        self.k3 = _k3_config(config)
        self.stage = _pipeline_stage(self.k3.num_layers)
        self.start_layer, self.end_layer = self.stage.start, self.stage.end  # read by SGLang's pool setup
        self.model = K3Model(self.k3, self.stage)
        if self.stage != StageRange.whole(self.k3.num_layers):
            logger.info("K3 pipeline stage: %s", describe_stage(self.stage, self.k3))
        trace_dir = worker_settings().stage_trace
        # k3 bench pp-prefill; one file per stage, so only the stage's first TP rank writes it
        self.trace = StageTrace(trace_dir, self.stage.start) if trace_dir and _tp_rank() == 0 else None
        if self.stage.is_last and self.k3.tie_word_embeddings and not self.stage.is_first:
            raise ValueError("tied word embeddings under pipeline parallelism are not supported (K3 unties them)")
        self.lm_head = nn.Linear(self.k3.hidden_size, self.k3.vocab_size, bias=False) if self.stage.is_last else None
        text_config = getattr(config, "text_config", config)
        # lm_head is replicated on every TP rank: each computes full-vocabulary logits, nothing to gather
        self.logits_processor = LogitsProcessor(config=text_config, skip_all_gather=True)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_dspark_layers_to_capture(self, layer_ids: list[int]) -> None:
        """SGLang's draft-model seam (its K3 has the same method): every forward hands the LogitsProcessor the
        streams after these layers, [T, len(layer_ids) * H] in layer order (K3Model's docstring), which it returns
        as `hidden_states` when the batch's capture_hidden_mode asks. Whole model only (no pipeline stage)."""
        ids = [int(i) for i in layer_ids]
        if self.stage != StageRange.whole(self.k3.num_layers):
            raise RuntimeError("capturing hidden states for a draft model needs the whole model on this rank "
                               f"(pipeline stage {self.stage})")
        if not ids or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= self.k3.num_layers:
            raise ValueError(f"layers to capture must be increasing layer ids in 0..{self.k3.num_layers - 1}, "
                             f"got {ids}")
        self.model.layers_to_capture = tuple(ids)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, input_embeds=None,
                inputs_embeds=None, pp_proxy_tensors=None, get_embedding: bool = False, **_):
        t0 = StageTrace.now_ns()
        out = self._stage_forward(input_ids, forward_batch, input_embeds if input_embeds is not None else inputs_embeds,
                                  pp_proxy_tensors)
        if self.trace is not None:
            mode = "decode" if forward_batch.forward_mode.is_decode() else "extend"
            self.trace.record(t0, StageTrace.now_ns(), int(input_ids.shape[0]), mode)
        return out

    def _stage_forward(self, input_ids: torch.Tensor, forward_batch, embeds, pp_proxy_tensors):
        """The first stage embeds, a later one continues from the received proxy; the last returns logits, the
        others the proxy for the next stage."""
        carry = None
        if not self.stage.is_first:  # the first stage ignores any proxy (the dynamic-chunking profiler sends one)
            carry = unpack_carry(pp_proxy_tensors.tensors, input_ids.shape[0], self.model.inherited_blocks,
                                 self.k3.hidden_size)
        out = self.model(input_ids, forward_batch, embeds, carry)
        if not self.stage.is_last:
            from sglang.srt.model_executor.forward_batch_info import PPProxyTensors

            return PPProxyTensors(pack_carry(*out))
        if self.model.layers_to_capture:
            return self.logits_processor(input_ids, out[0], self.lm_head, forward_batch, out[1])
        return self.logits_processor(input_ids, out, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        skipped = [0]

        def owns(name: str) -> bool:  # other stages' tensors are dropped before any MXFP4 dequantisation
            mine = self.stage.owns(name)
            skipped[0] += not mine
            return mine

        loader = K3WeightLoader(self, owns=owns)
        loader.load(weights)
        loader.finish()
        if self.stage != StageRange.whole(self.k3.num_layers):
            logger.info("K3 pipeline stage [%d, %d): loaded %d parameters, skipped %d checkpoint tensors of other "
                        "stages", self.stage.start, self.stage.end, len(loader.params), skipped[0])


class KimiK3LinearForCausalLM(KimiK3ForConditionalGeneration):
    """Text-only export name of the same model."""


EntryClass = [KimiK3ForConditionalGeneration, KimiK3LinearForCausalLM]
