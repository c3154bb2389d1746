"""K3_CSV's verify plan on the pipeline wire (pure torch).

Under pipeline parallelism the first stage plans each decode round (drafts and verify lengths) and every later
stage must run the same forward, so the plan rides the PP proxy dict beside `hidden_states` and `attn_res_bank`
(model/pipeline carry readers look up their own keys only):

    k3_csv_verify_lens   [B] int64, >= 1 (1 = the root only: no draft verified)
    k3_csv_verify_drafts [B, gamma] int64, row b's first lens[b] - 1 entries are its drafts, the rest 0

A round whose lengths are all 1 runs as a plain decode on every stage; otherwise as one chain verify.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

LENS_KEY = "k3_csv_verify_lens"
DRAFTS_KEY = "k3_csv_verify_drafts"


def plan_to_wire(lens: list[int], drafts: list[list[int]], gamma: int) -> dict[str, torch.Tensor]:
    """(verify_lens [B], drafts [B] lists of at least lens[b] - 1 tokens) -> the two wire tensors."""
    if len(lens) != len(drafts):
        raise ValueError(f"verify plan: {len(lens)} lengths for {len(drafts)} draft rows")
    if gamma < 1:
        raise ValueError(f"verify plan: gamma must be >= 1, got {gamma}")
    table = torch.zeros(len(lens), gamma, dtype=torch.int64)
    for b, (n, row) in enumerate(zip(lens, drafts)):
        if not 1 <= n <= gamma + 1:
            raise ValueError(f"verify plan: request {b} verifies {n} tokens, outside 1..{gamma + 1}")
        if len(row) < n - 1:
            raise ValueError(f"verify plan: request {b} verifies {n} tokens but has {len(row)} drafts")
        if n > 1:
            table[b, : n - 1] = torch.tensor(row[: n - 1], dtype=torch.int64)
    return {LENS_KEY: torch.tensor(lens, dtype=torch.int64), DRAFTS_KEY: table}


def plan_from_wire(tensors: Mapping, batch_size: int) -> tuple[list[int], list[list[int]]] | None:
    """The plan a previous stage sent (None when the dict carries none) for a batch of batch_size requests.

    Raises ValueError when it was planned for another batch size or is malformed (stages out of step)."""
    if LENS_KEY not in tensors and DRAFTS_KEY not in tensors:
        return None
    if LENS_KEY not in tensors or DRAFTS_KEY not in tensors:
        raise ValueError(f"verify plan on the pipeline wire needs both {LENS_KEY} and {DRAFTS_KEY}")
    lens_t, table = tensors[LENS_KEY], tensors[DRAFTS_KEY]
    if lens_t.dim() != 1 or lens_t.shape[0] != batch_size or table.dim() != 2 or table.shape[0] != batch_size:
        raise ValueError(f"verify plan for {tuple(lens_t.shape)} / {tuple(table.shape)} requests, this stage runs "
                         f"{batch_size} (pipeline stages out of step)")
    lens = [int(n) for n in lens_t.tolist()]
    if min(lens, default=1) < 1 or max(lens, default=1) > table.shape[1] + 1:
        raise ValueError(f"verify plan lengths {lens} outside 1..{table.shape[1] + 1}")
    rows = table.tolist()
    return lens, [[int(t) for t in row[: n - 1]] for row, n in zip(rows, lens)]
