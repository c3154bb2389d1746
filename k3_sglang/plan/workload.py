"""What is served (Workload) and how SGLang is tuned to serve it (Serving)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from k3_sglang.plan.attention import ATTENTION_CHOICES
from k3_sglang.plan.fields import require_bool, require_choice, require_float, require_int
from k3_sglang.plan.sessions import DEFAULT_STATES_PER_PATH, UNCAPPED

# SGLang's defaults and the planner's reserve assumptions, in one place (docs/capacity.md lists them).
SGLANG_DEFAULT_MAMBA_RATIO = 0.9        # --mamba-full-memory-ratio fallback in SGLang 0.5.23
DEFAULT_MEM_FRACTION_STATIC = 0.90      # K3 cookbook cells; the rest is activations, CUDA graphs, NCCL
DEFAULT_PAGE_SIZE = 64                  # MLA pages (308,608 tokens = 4,822 pages of 64)
MAMBA_BASE_SLOTS = 3                    # SGLang MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
MAMBA_STRATEGIES = ("extra_buffer", "extra_buffer_lazy", "no_buffer")
AUTO = "auto"


@dataclass(frozen=True)
class Workload:
    """Concurrent sessions of `context_length` prompt tokens plus `output_length` generated tokens."""

    context_length: int = 100_000
    output_length: int = 4_096
    sessions: int = 48

    def __post_init__(self) -> None:
        require_int("context_length", self.context_length)
        require_int("output_length", self.output_length, minimum=0)
        require_int("sessions", self.sessions)

    @property
    def session_tokens(self) -> int:
        """KV tokens one session holds at its longest."""
        return self.context_length + self.output_length

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON)."""
        return {"context_length": self.context_length, "output_length": self.output_length,
                "sessions": self.sessions}


@dataclass(frozen=True)
class Serving:
    """SGLang memory knobs the capacity depends on.

    mamba_full_memory_ratio: a number (state pool / KV pool), or "auto" for the balanced ratio r* that
    makes both pools run out at the same session count for this workload.
    """

    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC
    mamba_full_memory_ratio: float | str = SGLANG_DEFAULT_MAMBA_RATIO
    mamba_radix_cache_strategy: str = "extra_buffer"
    page_size: int = DEFAULT_PAGE_SIZE
    draft_tokens: int = 0
    max_running_requests: int | None = None
    replicate_q_proj: bool = True
    decode_radix_cache: bool = False  # PD decode servers: --disaggregation-decode-enable-radix-cache
    attention_backend: str = "auto"  # MLA attention backend (plan/attention.py)
    mamba_states_per_path: int = DEFAULT_STATES_PER_PATH  # --mamba-max-states-per-path (-1: SGLang's no cap)
    hicache_host_gib: float = 0.0  # HiCache host tier per rank (0: none): cached sessions on host

    def __post_init__(self) -> None:
        require_float("mem_fraction_static", self.mem_fraction_static, 0.0, 1.0)
        if self.mamba_full_memory_ratio != AUTO:
            require_float("mamba_full_memory_ratio", self.mamba_full_memory_ratio)
        require_choice("mamba_radix_cache_strategy", self.mamba_radix_cache_strategy, MAMBA_STRATEGIES)
        require_int("page_size", self.page_size)
        require_int("draft_tokens", self.draft_tokens, minimum=0)
        if self.max_running_requests is not None:
            require_int("max_running_requests", self.max_running_requests)
        require_bool("replicate_q_proj", self.replicate_q_proj)
        require_bool("decode_radix_cache", self.decode_radix_cache)
        require_choice("attention_backend", self.attention_backend, ATTENTION_CHOICES)
        if self.mamba_states_per_path != UNCAPPED:
            require_int("mamba_states_per_path", self.mamba_states_per_path)
        require_float("hicache_host_gib", self.hicache_host_gib, low_inclusive=True)

    @property
    def auto_ratio(self) -> bool:
        """True when the state/KV ratio is solved from the workload."""
        return self.mamba_full_memory_ratio == AUTO

    def state_slots_per_request(self, overlap: bool, role: str = "unified") -> int:
        """KDA state slots one running request holds (S), SGLang 0.5.23's `_calculate_mamba_ratio`:
        5 with extra_buffer + overlap, 4 lazy or no overlap, 3 no_buffer; and 1 on a PD decode server,
        which runs without a radix cache unless `decode_radix_cache` (`pd_disaggregation_hook.py` sets
        `disable_radix_cache`, and the ratio is then 1: one state slot per running request)."""
        if role == "decode" and not self.decode_radix_cache:
            return 1
        if self.mamba_radix_cache_strategy == "no_buffer":
            tracking = 0
        elif self.mamba_radix_cache_strategy == "extra_buffer_lazy" or not overlap:
            tracking = 1
        else:
            tracking = 2
        return MAMBA_BASE_SLOTS + tracking

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON)."""
        return {"mem_fraction_static": self.mem_fraction_static,
                "mamba_full_memory_ratio": self.mamba_full_memory_ratio,
                "mamba_radix_cache_strategy": self.mamba_radix_cache_strategy, "page_size": self.page_size,
                "draft_tokens": self.draft_tokens, "max_running_requests": self.max_running_requests,
                "replicate_q_proj": self.replicate_q_proj, "decode_radix_cache": self.decode_radix_cache,
                "mamba_states_per_path": self.mamba_states_per_path, "hicache_host_gib": self.hicache_host_gib,
                "attention_backend": self.attention_backend}
