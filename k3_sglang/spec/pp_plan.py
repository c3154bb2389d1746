"""K3_CSV's verify plan on the pipeline wire (pure torch).

Under pipeline parallelism the first stage plans each decode round (drafts and verify lengths) and every later
stage must run the same forward, so a verify round's plan rides the PP proxy dict beside `hidden_states` and
`attn_res_bank` (the pipeline carry readers look up their own keys only), as one tensor (each tensor is its own
message on the wire):

    k3_csv_verify_plan [B, 1 + gamma] int64: column 0 = verify length (>= 1; 1 = the root only), then the
    request's drafts (its first length - 1 entries; the rest 0)

A decode round that carries no plan is a plain decode on every stage (one token per request), so the rounds a
settled planner decodes plainly cost the wire nothing extra.

The results travel back around the ring as SGLang's output dict; its per-request speculative entries
(`spec_accept_lens`, `spec_new_seq_lens`, `spec_bonus_tokens`, and on a verify round `spec_accept_index`, from which
every earlier stage runs SGLang's commit after acceptance) are packed into one tensor for the trip and unpacked
before SGLang reads them:

    k3_csv_accept [4, B] int64: accept lens, new (committed) seq lens, bonus tokens, 1 where the round verified
    (its accept index is a chain's, rebuilt from the accept lens: spec/contract.py chain_accept_index)
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

PLAN_KEY = "k3_csv_verify_plan"
ACCEPT_KEY = "k3_csv_accept"
ACCEPT_ENTRIES = ("spec_accept_lens", "spec_new_seq_lens", "spec_bonus_tokens")
ACCEPT_INDEX = "spec_accept_index"


def plan_to_wire(lens: list[int], drafts: list[list[int]], gamma: int) -> dict[str, torch.Tensor]:
    """(verify_lens [B], drafts [B] lists of at least lens[b] - 1 tokens) -> {PLAN_KEY: [B, 1 + gamma]}."""
    if len(lens) != len(drafts):
        raise ValueError(f"verify plan: {len(lens)} lengths for {len(drafts)} draft rows")
    if gamma < 1:
        raise ValueError(f"verify plan: gamma must be >= 1, got {gamma}")
    table = torch.zeros(len(lens), 1 + gamma, dtype=torch.int64)
    for b, (n, row) in enumerate(zip(lens, drafts)):
        if not 1 <= n <= gamma + 1:
            raise ValueError(f"verify plan: request {b} verifies {n} tokens, outside 1..{gamma + 1}")
        if len(row) < n - 1:
            raise ValueError(f"verify plan: request {b} verifies {n} tokens but has {len(row)} drafts")
        table[b, 0] = n
        if n > 1:
            table[b, 1:n] = torch.tensor(row[: n - 1], dtype=torch.int64)
    return {PLAN_KEY: table}


def plain_plan(batch_size: int) -> tuple[list[int], list[list[int]]]:
    """The plan of a round that carries none: every request decodes its root only."""
    return [1] * batch_size, [[] for _ in range(batch_size)]


def plan_from_wire(tensors: Mapping, batch_size: int) -> tuple[list[int], list[list[int]]] | None:
    """The plan a previous stage sent (None when the dict carries none) for a batch of batch_size requests.

    Raises ValueError when it was planned for another batch size or is malformed (stages out of step)."""
    if PLAN_KEY not in tensors:
        return None
    table = tensors[PLAN_KEY]
    if table.dim() != 2 or table.shape[0] != batch_size or table.shape[1] < 2:
        raise ValueError(f"verify plan of shape {tuple(table.shape)}, this stage runs {batch_size} requests "
                         "(pipeline stages out of step)")
    rows = table.tolist()
    lens = [int(row[0]) for row in rows]
    if min(lens, default=1) < 1 or max(lens, default=1) > table.shape[1]:
        raise ValueError(f"verify plan lengths {lens} outside 1..{table.shape[1]}")
    return lens, [[int(t) for t in row[1:n]] for row, n in zip(rows, lens)]


def pack_accept(tensors: dict, width: int) -> dict:
    """SGLang's output dict -> the same dict with its speculative entries ([B] each, and a verify round's chain
    accept index [B, width]) as one ACCEPT_KEY [4, B] int64 (a dict without them is returned unchanged)."""
    if not all(k in tensors for k in ACCEPT_ENTRIES):
        return tensors
    rows = [tensors[k].reshape(-1).to(torch.int64) for k in ACCEPT_ENTRIES]
    if len({r.shape[0] for r in rows}) != 1:
        raise ValueError(f"speculative results of different lengths: {[r.shape[0] for r in rows]}")
    verified = ACCEPT_INDEX in tensors
    if verified:
        from k3_sglang.spec.contract import chain_accept_index

        index = tensors[ACCEPT_INDEX].to(torch.int64)
        if not torch.equal(index.cpu(), chain_accept_index(rows[0].cpu(), width)):
            raise ValueError(f"{ACCEPT_INDEX} {tuple(index.shape)} is not the chain of the accept lens (width {width})")
    packed = {k: v for k, v in tensors.items() if k not in ACCEPT_ENTRIES and k != ACCEPT_INDEX}
    packed[ACCEPT_KEY] = torch.stack(rows + [torch.full_like(rows[0], int(verified))]).contiguous()
    return packed


def unpack_accept(tensors: Mapping, seq_lens_dtype: torch.dtype, width: int) -> dict | None:
    """The dict SGLang reads (accept lens int32 as its workers return them, seq lens in the batch's dtype, bonus
    tokens int64, a verify round's accept index [B, width] int64) from a packed one, or None when it carries no
    ACCEPT_KEY."""
    if ACCEPT_KEY not in tensors:
        return None
    packed = tensors[ACCEPT_KEY]
    if packed.dim() != 2 or packed.shape[0] != 4:
        raise ValueError(f"{ACCEPT_KEY} must be [4, B], got {tuple(packed.shape)}")
    out = {k: v for k, v in tensors.items() if k != ACCEPT_KEY}
    out.update(spec_accept_lens=packed[0].to(torch.int32), spec_new_seq_lens=packed[1].to(seq_lens_dtype),
               spec_bonus_tokens=packed[2].clone())
    if packed.shape[1] and bool(packed[3].all()):
        from k3_sglang.spec.contract import chain_accept_index

        out[ACCEPT_INDEX] = chain_accept_index(packed[0], width)
    return out
