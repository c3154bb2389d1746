"""K3_CSV's SGLang algorithm class: server-argument defaults and the restrictions checked at start."""
from __future__ import annotations

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

DEFAULT_DRAFT_WIDTH = 8  # root + 7 drafts (gamma 7, K3's published setting)


def validate_server_args(server_args) -> None:
    """Refuse what K3_CSV cannot run (SGLang calls this while resolving ServerArgs; a ValueError stops the start)."""
    from k3_sglang.spec.settings import SpecSettings

    from k3_sglang.spec.contract import contract_refusals

    SpecSettings.from_env().ready()  # bad K3_SPEC_* values fail here, before any worker starts
    reasons = contract_refusals(server_args)
    if reasons:
        raise ValueError("; ".join(reasons))
    if int(getattr(server_args, "pp_size", 1) or 1) > 1:
        from k3_sglang.spec.pp_hooks import pipeline_refusals

        reasons = pipeline_refusals(server_args)
        if reasons:
            raise ValueError("--speculative-algorithm " + "; ".join(reasons))
    width = getattr(server_args, "speculative_num_draft_tokens", None)
    if width is not None and int(width) < 2:
        raise ValueError(f"--speculative-num-draft-tokens {width}: K3_CSV needs at least 2 (a root and one draft)")
    topk = getattr(server_args, "speculative_eagle_topk", None)
    if topk not in (None, 1):
        raise ValueError(f"--speculative-eagle-topk {topk}: K3_CSV verifies chains (topk 1) only")


class K3SpecAlgo(CustomSpecAlgo):
    """A draft-model-free chain verifier: no draft KV, chain width = --speculative-num-draft-tokens (root + drafts)."""

    # SGLang 0.5.23's scheduler also calls these enum-only methods on the algorithm object
    def carries_draft_hidden_states(self) -> bool:
        return False  # no draft model: PD hands the decode side nothing but the bonus token

    def need_topk(self) -> bool:
        return False

    def get_platform_worker_cls(self):
        return None

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens: bool = True,
                          needs_confidence_relay: bool = False):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):
        """PD decode: the first decode batch after the KV arrived. Our drafter needs only token ids (it reads the
        request's own context), so the draft state is just the committed lengths and the bonus token."""
        from sglang.srt.runtime_context import get_spec

        from k3_sglang.spec.info import one_token_draft_state

        return one_token_draft_state(int(get_spec().speculative_num_draft_tokens), batch.seq_lens.clone(),
                                     last_tokens_tensor)

    def has_draft_kv(self) -> bool:
        return False

    def supports_ragged_verify(self) -> bool:
        return False  # ragged lengths are our own layout (spec/info.py), not SGLang's ragged-verify graphs

    def handle_server_args(self, server_args) -> None:
        width = server_args.speculative_num_draft_tokens or DEFAULT_DRAFT_WIDTH
        server_args.speculative_num_draft_tokens = int(width)
        server_args.speculative_num_steps = int(width) - 1
        server_args.speculative_eagle_topk = 1
        server_args.enable_mixed_chunk = False
