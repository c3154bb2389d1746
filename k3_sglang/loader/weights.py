"""Stream K3 checkpoint tensors into the model.

Handles the published layout: `language_model.` / bare `model.` prefixes, vision tensors
skipped by name, MXFP4 routed experts (packed + E8M0 scales, dequantised into the stacked
expert parameters), `A_log` narrowed to the head count, fp32 conv/dt_bias/A_log kept fp32.
The KDA/MLA `self_attn.g_proj` name clash resolves by layer type: each layer's module is
already the right mixer, so the same name lands on the right role.

Under tensor/expert parallelism a parameter marked `k3_shard = (dim, Shard)` receives its rank's block of the
checkpoint tensor (`k3_sglang.parallel.tp` layout), and a rank's routed experts are its EP range
(`RoutedExperts.first`); other ranks' experts are skipped before dequantisation.

Under pipeline parallelism every rank streams the whole checkpoint: `owns` (a stage's
`StageRange.owns`) drops other stages' tensors before anything is dequantised, and `finish()`
checks the stage's own parameters only, so a stage's missing tensor still fails by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

from k3_sglang.kernels import dispatch

SKIPPED_PREFIXES = ("vision_tower.", "mm_projector.", "language_model.vision_tower.", "language_model.mm_projector.")
EXPERT_RE = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123])\.(weight|weight_packed|weight_scale)$")


def canonical_name(name: str) -> str | None:
    """Checkpoint name -> model parameter name (None for tensors the text model skips)."""
    if name.startswith(SKIPPED_PREFIXES):
        return None
    if name.startswith("language_model."):
        name = name[len("language_model."):]
    if name.startswith("layers."):  # some exports drop the inner `model.`
        name = "model." + name
    return name


def _full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The checkpoint shape of a (possibly tensor-parallel sharded) parameter."""
    shape = list(param.shape)
    shard = getattr(param, "k3_shard", None)
    if shard is not None:
        dim, part = shard
        shape[dim] *= part.size
    return tuple(shape)


def _this_rank_block(name: str, param: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's block of a checkpoint tensor for a sharded parameter (`k3_sglang.parallel.tp` layout)."""
    shard = getattr(param, "k3_shard", None)
    if shard is None:
        return tensor
    dim, part = shard
    if tensor.dim() <= dim or tensor.shape[dim] != param.shape[dim] * part.size:
        raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} does not split into {part.size} blocks "
                              f"of the model's {tuple(param.shape)} along dim {dim}")
    start, stop = part.bounds(tensor.shape[dim], name)
    return tensor.narrow(dim, start, stop - start)


class WeightLoadError(ValueError):
    """A checkpoint tensor that does not fit the model (unknown name, wrong shape, missing)."""


class K3WeightLoader:
    """Copies a stream of (name, tensor) into `model`; call `finish()` to check completeness."""

    def __init__(self, model: nn.Module, owns: Callable[[str], bool] | None = None):
        self.params = dict(model.named_parameters())
        self.expert_modules = {n: m for n, m in model.named_modules() if hasattr(m, "num_total")}
        self.owns = owns or (lambda _name: True)
        self.loaded: set[str] = set()
        self._expert_parts: dict[tuple[str, int, str], dict[str, torch.Tensor]] = {}
        self._experts_loaded: dict[str, set[tuple[int, str]]] = {}

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for raw_name, tensor in weights:
            name = canonical_name(raw_name)
            if name is None or not self.owns(name):  # another pipeline stage's tensor: never dequantised here
                continue
            match = EXPERT_RE.match(name)
            if match:
                self._load_expert_part(match.group(1), int(match.group(2)), match.group(3), match.group(4), tensor)
            else:
                self._load_plain(name, tensor)

    def _load_plain(self, name: str, tensor: torch.Tensor) -> None:
        param = self.params.get(name)
        if param is None:
            raise WeightLoadError(f"checkpoint tensor {name!r} has no matching model parameter")
        full = _full_shape(param)
        if name.endswith(".A_log") and tensor.dim() == 1 and tensor.shape[0] > full[0]:
            tensor = tensor.narrow(0, 0, full[0])
        tensor = _this_rank_block(name, param, tensor)
        if tuple(tensor.shape) != tuple(param.shape):
            raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))
        self.loaded.add(name)

    def _load_expert_part(self, base: str, expert: int, which: str, kind: str, tensor: torch.Tensor) -> None:
        name = f"{base}.{which}"
        param = self.params.get(name)
        if param is None:
            raise WeightLoadError(f"checkpoint expert tensor for {name!r} has no matching model parameter")
        first, total = self._expert_range(name)
        if 0 <= expert < total and not first <= expert < first + param.shape[0]:
            return  # another expert-parallel rank's expert: never dequantised here
        if kind == "weight":
            self._store_expert(name, param, expert, which, tensor)
            return
        parts = self._expert_parts.setdefault((name, expert, which), {})
        parts[kind] = tensor
        if len(parts) == 2:
            dense = dispatch.dequant_mxfp4(parts["weight_packed"], parts["weight_scale"], torch.float32)
            del self._expert_parts[(name, expert, which)]
            self._store_expert(name, param, expert, which, dense)

    def _store_expert(self, name: str, param: torch.Tensor, expert: int, which: str, dense: torch.Tensor) -> None:
        first, total = self._expert_range(name)
        if not 0 <= expert < total:
            raise WeightLoadError(f"{name}: expert index {expert} outside 0..{total - 1}")
        expert -= first
        shard = getattr(param, "k3_shard", None)
        if shard is not None:  # MoE TP: this rank's intermediate block (dim 1 of w1/w3, 2 of w2 -> 0 / 1 here)
            dim, part = shard
            start, stop = part.bounds(param.shape[dim] * part.size, name)
            if dense.shape[dim - 1] != param.shape[dim] * part.size:
                raise WeightLoadError(f"{name}[{expert}]: checkpoint dimension {dim - 1} is {dense.shape[dim - 1]}, "
                                      f"this rank's block {param.shape[dim]} x {part.size} ranks")
            dense = dense.narrow(dim - 1, start, stop - start)
        if tuple(dense.shape) != tuple(param.shape[1:]):
            raise WeightLoadError(f"{name}[{expert}]: shape {tuple(dense.shape)} != {tuple(param.shape[1:])}")
        with torch.no_grad():
            param[expert].copy_(dense.to(param.dtype))
        self._experts_loaded.setdefault(name, set()).add((expert, which))

    def _expert_range(self, name: str) -> tuple[int, int]:
        """(first expert held here, experts in the checkpoint) of the stacked parameter `name`."""
        module = self.expert_modules.get(name.rsplit(".", 1)[0])
        if module is None:
            return 0, self.params[name].shape[0]
        return module.first, module.num_total

    def finish(self) -> None:
        """Raise WeightLoadError naming what the checkpoint did not provide."""
        if self._expert_parts:
            key = next(iter(self._expert_parts))
            raise WeightLoadError(f"MXFP4 expert {key} has only {sorted(self._expert_parts[key])}")
        missing = []
        for name, param in self.params.items():
            if EXPERT_RE.match(name + ".weight") or name.endswith((".experts.w1", ".experts.w2", ".experts.w3")):
                if len(self._experts_loaded.get(name, ())) != param.shape[0]:
                    missing.append(name)
            elif name not in self.loaded:
                missing.append(name)
        if missing:
            raise WeightLoadError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:5]}")

