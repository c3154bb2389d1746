"""Pipeline stages of the K3 decoder: which layers a stage owns, and what crosses a stage boundary.

Pure (torch only, no SGLang import). A stage is a contiguous layer range [start, end) of the model's
`num_layers`; SGLang's `get_pp_indices` chooses it (honouring SGLANG_PP_LAYER_PARTITION) and `stage_ranges`
below is the same rule, kept only so that benchmarks and tests can describe a partition without a server.

What a stage hands the next one (SGLang's own K3 uses the same keys and layout, so the two agree on the wire):

    {"hidden_states": live [T, H],            # the stream after the stage's last layer (the open block's sum)
     "attn_res_bank": bank [T, NB, H]}        # NB = ceil(end / block_size) sealed block snapshots, token-major

Both contiguous (gloo refuses non-contiguous sends). Bytes per token per hop for a cut before layer c:
(1 + ceil(c / block_size)) * H * dtype_bytes.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

LIVE_KEY = "hidden_states"
BANK_KEY = "attn_res_bank"
# Checkpoint names (canonical, see loader/weights.py) of the pieces outside the layer stack.
FIRST_STAGE_PREFIXES = ("model.embed_tokens.",)
LAST_STAGE_PREFIXES = ("model.norm.", "model.output_attn_res_norm.", "model.output_attn_res_proj.", "lm_head.")
LAYER_NAME_RE = re.compile(r"^model\.layers\.(\d+)\.")


def num_blocks(layers: int, block_size: int) -> int:
    """Sealed AttnRes blocks after `layers` layers: ceil(layers / block_size) (layer 0 seals the embedding)."""
    return -(-layers // block_size)


@dataclass(frozen=True)
class StageRange:
    """Layers [start, end) of a `num_layers`-layer model run by one pipeline stage."""

    start: int
    end: int
    num_layers: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= self.num_layers:
            raise ValueError(f"pipeline stage [{self.start}, {self.end}) is not a non-empty layer range of a "
                             f"{self.num_layers}-layer model (more stages than layers, or a bad "
                             "SGLANG_PP_LAYER_PARTITION)")

    @classmethod
    def whole(cls, num_layers: int) -> "StageRange":
        return cls(0, num_layers, num_layers)

    @property
    def is_first(self) -> bool:
        """Holds the embedding."""
        return self.start == 0

    @property
    def is_last(self) -> bool:
        """Holds the output AttnRes read, the final norm and lm_head."""
        return self.end == self.num_layers

    def __contains__(self, layer_id: int) -> bool:
        return self.start <= layer_id < self.end

    def inherited_blocks(self, block_size: int) -> int:
        """Bank width this stage receives: ceil(start / block_size) (0 on the first stage)."""
        return num_blocks(self.start, block_size)

    def sent_blocks(self, block_size: int) -> int:
        """Bank width this stage sends: ceil(end / block_size)."""
        return num_blocks(self.end, block_size)

    def owns(self, name: str) -> bool:
        """Whether the canonical checkpoint tensor `name` belongs to this stage. Names outside the known pieces
        (and layer ids beyond the model) count as owned, so the loader's "no matching parameter" error still
        names them on every stage."""
        match = LAYER_NAME_RE.match(name)
        if match:
            layer = int(match.group(1))
            return layer in self or layer >= self.num_layers
        if name.startswith(FIRST_STAGE_PREFIXES):
            return self.is_first
        if name.startswith(LAST_STAGE_PREFIXES):
            return self.is_last
        return True


def stage_ranges(num_layers: int, pp_size: int, partition: str | None = None) -> list[StageRange]:
    """Every stage of a pp_size-way split, by SGLang's rule (`get_pp_indices`): `partition` is the
    SGLANG_PP_LAYER_PARTITION value (comma list of layer counts summing to num_layers); without it the layers
    split evenly and the last num_layers % pp_size stages get one extra."""
    if pp_size < 1:
        raise ValueError(f"pp_size must be >= 1, got {pp_size}")
    if partition is not None and pp_size > 1:
        try:
            counts = [int(x) for x in partition.split(",")]
        except ValueError:
            raise ValueError(f"SGLANG_PP_LAYER_PARTITION {partition!r}: not a comma list of integers") from None
        if len(counts) != pp_size or sum(counts) != num_layers:
            raise ValueError(f"SGLANG_PP_LAYER_PARTITION {partition!r}: needs {pp_size} counts summing to "
                             f"{num_layers}")
    else:
        base, extra = divmod(num_layers, pp_size)
        counts = [base + (1 if r >= pp_size - extra else 0) for r in range(pp_size)]
    bounds = [sum(counts[:r]) for r in range(pp_size + 1)]
    return [StageRange(bounds[r], bounds[r + 1], num_layers) for r in range(pp_size)]


def hop_bytes_per_token(cut: int, block_size: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes per token crossing the boundary before layer `cut`: (1 + ceil(cut / bs)) * hidden * dtype_bytes."""
    return (1 + num_blocks(cut, block_size)) * hidden * dtype_bytes


def pack_carry(live: torch.Tensor, bank: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """live [T, H] and the sealed blocks (each [T, H]) -> the wire dict, both tensors contiguous:
    hidden_states [T, H], attn_res_bank [T, NB, H] (token-major)."""
    if live.dim() != 2:
        raise ValueError(f"pipeline carry: live stream must be [T, H], got {tuple(live.shape)}")
    if bank:
        stacked = torch.stack(bank, dim=1)
    else:
        stacked = live.new_empty((live.shape[0], 0, live.shape[1]))
    return {LIVE_KEY: live.contiguous(), BANK_KEY: stacked.contiguous()}


def unpack_carry(tensors: Mapping, num_tokens: int, blocks: int, hidden: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The wire dict a previous stage sent -> (live [T, H], bank: `blocks` views [T, H]).

    Read by key only (SGLang's receive adds a "__msg_type__" string entry). Raises ValueError when a key is
    missing or a shape does not match this stage (a partition or batch mismatch between ranks)."""
    missing = [k for k in (LIVE_KEY, BANK_KEY) if k not in tensors]
    if missing:
        raise ValueError(f"pipeline carry from the previous stage lacks {missing} (got keys {sorted(tensors)})")
    live, bank = tensors[LIVE_KEY], tensors[BANK_KEY]
    if tuple(live.shape) != (num_tokens, hidden):
        raise ValueError(f"pipeline carry: {LIVE_KEY} is {tuple(live.shape)}, this stage expects "
                         f"({num_tokens}, {hidden})")
    if tuple(bank.shape) != (num_tokens, blocks, hidden):
        raise ValueError(f"pipeline carry: {BANK_KEY} is {tuple(bank.shape)}, this stage expects "
                         f"({num_tokens}, {blocks}, {hidden}) (do all ranks use the same layer partition?)")
    return live, list(bank.unbind(1))


def _blocks(n: int) -> str:
    return f"{n} AttnRes block" + ("" if n == 1 else "s")


def describe_stage(stage: StageRange, cfg) -> str:
    """One line naming a stage's layers by kind and what it receives and sends (logged by every PP rank).
    cfg: the K3Config (kda.layer_ids, mla.layer_ids, attn_res.block_size)."""
    kda = [i for i in cfg.kda.layer_ids if i in stage]
    mla = [i for i in cfg.mla.layer_ids if i in stage]
    kinds = "; ".join(f"{name} {', '.join(map(str, ids))}" if ids else f"no {name}"
                      for name, ids in (("KDA", kda), ("MLA", mla)))
    bs = cfg.attn_res.block_size
    parts = [f"layers [{stage.start}, {stage.end}) of {stage.num_layers} ({kinds})",
             "first stage (embedding)" if stage.is_first else
             f"receives hidden_states + {_blocks(stage.inherited_blocks(bs))}",
             "last stage (output read, norm, lm_head)" if stage.is_last else
             f"sends hidden_states + {_blocks(stage.sent_blocks(bs))}"]
    return "; ".join(parts)
