"""A pipeline of K3Model stages in one process, each with its own stage-local pools, fed chunked prefills.

The pools mimic the parts of SGLang's per-stage pools the portable layers touch: the MLA KV pool holds only the
stage's MLA layers behind a global -> dense id map, and the KDA ("mamba") pool only its KDA layers behind
`mamba_map`; looking up another stage's layer fails as SGLang's `mamba2_layer_index` assertion does. Unwritten
rows are poisoned, so a read of a row nobody wrote shows up in the outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from k3_sglang.config import K3Config
from k3_sglang.loader.weights import K3WeightLoader
from k3_sglang.model.decoder import K3Model
from k3_sglang.parallel.pipeline import StageRange, pack_carry, unpack_carry

POISON = 1e30


class StageKVPool:
    """MLA latent rows [N, 1, L] for the stage's MLA layers only (global layer id -> dense index)."""

    def __init__(self, mla_ids: list[int], size: int, width: int):
        self.map = {lid: i for i, lid in enumerate(mla_ids)}
        self.buffers = [torch.full((size, 1, width), POISON) for _ in mla_ids]

    def _buffer(self, layer_id: int) -> torch.Tensor:
        if layer_id not in self.map:
            raise AssertionError(f"MLA layer {layer_id} is not in this stage's pool {sorted(self.map)}")
        return self.buffers[self.map[layer_id]]

    def set_mla_kv_buffer(self, layer, loc, k_nope, k_rope) -> None:
        self._buffer(layer.layer_id)[loc] = torch.cat([k_nope, k_rope], dim=-1).to(torch.float32)

    def set_kv_buffer(self, layer, loc, k, _v) -> None:
        self._buffer(layer.layer_id)[loc] = k.to(torch.float32)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._buffer(layer_id)


@dataclass
class LayerState:
    conv: list[torch.Tensor]
    temporal: torch.Tensor


class StageMambaPool:
    """KDA conv windows and fp32 recurrent states for the stage's KDA layers only (SGLang's mamba_map)."""

    def __init__(self, cfg: K3Config, kda_ids: list[int], slots: int):
        k = cfg.kda
        self.mamba_map = {lid: i for i, lid in enumerate(kda_ids)}
        self.layers = [LayerState([torch.full((slots, k.conv_kernel_size - 1, 3 * k.proj_dim), POISON)],
                                  torch.full((slots, k.num_heads, k.head_dim, k.head_dim), POISON))
                       for _ in kda_ids]

    def mamba2_layer_cache(self, layer_id: int) -> LayerState:
        assert layer_id in self.mamba_map, f"KDA layer {layer_id} is not in this stage's pool {sorted(self.mamba_map)}"
        return self.layers[self.mamba_map[layer_id]]


class StageBackend:
    """What `get_attn_backend()` returns inside one stage's forward (SGLang's hybrid linear backend shape)."""

    def __init__(self, cfg: K3Config, stage: StageRange, size: int, max_reqs: int, max_ctx: int):
        width = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim
        req_to_token = torch.arange(max_reqs * max_ctx, dtype=torch.int32).view(max_reqs, max_ctx)  # dense rows
        kv = StageKVPool([i for i in cfg.mla.layer_ids if i in stage], size, width)
        self.full_attn_backend = SimpleNamespace(token_to_kv_pool=kv,
                                                 req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
        mamba = StageMambaPool(cfg, [i for i in cfg.kda.layer_ids if i in stage], max_reqs)
        self.linear_attn_backend = SimpleNamespace(req_to_token_pool=mamba, forward_metadata=None)
        self.kv, self.mamba, self.req_to_token = kv, mamba, req_to_token


def extend_batch(backend: StageBackend, reqs: list[int], prefix: list[int], new: list[int]):
    """A ForwardBatch-like extend batch: request reqs[i] adds new[i] tokens after prefix[i] cached ones."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    loc = torch.cat([backend.req_to_token[r, p: p + n].long() for r, p, n in zip(reqs, prefix, new)])
    qsl = [0]
    for n in new:
        qsl.append(qsl[-1] + n)
    backend.linear_attn_backend.forward_metadata = SimpleNamespace(
        mamba_cache_indices=torch.tensor(reqs, dtype=torch.int32), query_start_loc=torch.tensor(qsl, dtype=torch.int32))
    seq = [p + n for p, n in zip(prefix, new)]
    return SimpleNamespace(forward_mode=ForwardMode.EXTEND, out_cache_loc=loc, extend_prefix_lens_cpu=list(prefix),
                           extend_seq_lens_cpu=list(new), extend_seq_lens=torch.tensor(new, dtype=torch.int32),
                           extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32), req_pool_indices=torch.tensor(reqs, dtype=torch.int64),
                           seq_lens=torch.tensor(seq), seq_lens_cpu=torch.tensor(seq))


class _Holder(torch.nn.Module):
    """The parameter layout of the SGLang entry class (model.* + lm_head on the last stage)."""

    def __init__(self, cfg: K3Config, stage: StageRange):
        super().__init__()
        self.model = K3Model(cfg, stage)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if stage.is_last else None


class StagePipeline:
    """Stages of one partition, weights loaded per stage (strict), run chunk by chunk through the wire format."""

    def __init__(self, cfg: K3Config, stages: list[StageRange], state: dict[str, torch.Tensor], size: int = 4096,
                 max_reqs: int = 4, max_ctx: int = 1024):
        self.cfg, self.stages = cfg, stages
        self.holders, self.backends = [], []
        for stage in stages:
            holder = _Holder(cfg, stage)
            loader = K3WeightLoader(holder, owns=stage.owns)
            loader.load(state.items())
            loader.finish()
            self.holders.append(holder)
            self.backends.append(StageBackend(cfg, stage, size, max_reqs, max_ctx))
        self.hop_bytes: list[list[int]] = [[] for _ in stages[1:]]  # per hop: bytes of every chunk sent

    def extend(self, monkeypatch, ids: torch.Tensor, reqs: list[int], prefix: list[int], new: list[int]) -> torch.Tensor:
        """One extend step through every stage: ids [T] -> the last stage's final hidden states [T, H]."""
        from sglang.srt.model_executor import forward_context

        carry = None
        for s, (holder, backend) in enumerate(zip(self.holders, self.backends)):
            monkeypatch.setattr(forward_context, "get_attn_backend", lambda b=backend: b)
            batch = extend_batch(backend, reqs, prefix, new)
            if carry is not None:
                wire = {k: v.clone() for k, v in carry.items()}  # what the receiver allocates and fills
                wire["__msg_type__"] = "proxy"  # SGLang's receive leaves this beside the tensors
                carry = unpack_carry(wire, ids.shape[0], holder.model.inherited_blocks, self.cfg.hidden_size)
            with torch.no_grad():
                out = holder.model(ids, batch, None, carry)
            if self.stages[s].is_last:
                return out
            carry = pack_carry(*out)
            for t in carry.values():
                assert t.is_contiguous()
            self.hop_bytes[s].append(sum(t.numel() * t.element_size() for t in carry.values()))
        raise AssertionError("no last stage")

    def kda_states(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Global KDA layer id -> (conv windows, recurrent states) over all stages."""
        out = {}
        for backend in self.backends:
            for lid, i in backend.mamba.mamba_map.items():
                out[lid] = (backend.mamba.layers[i].conv[0], backend.mamba.layers[i].temporal)
        return out

    def mla_rows(self) -> dict[int, torch.Tensor]:
        return {lid: b.kv.buffers[i] for b in self.backends for lid, i in b.kv.map.items()}
