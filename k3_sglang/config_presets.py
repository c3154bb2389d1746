"""Named K3 configurations: the published `k3-full` and the structural miniature `k3-tiny`."""

from __future__ import annotations

from k3_sglang.config import (
    MXFP4_IGNORE,
    AttnResConfig,
    K3Config,
    KDAConfig,
    MLAConfig,
    MoEConfig,
    QuantConfig,
    SiTUConfig,
    TokenIds,
)


def k3_layer_split(num_layers: int, period: int = 4) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """K3's pattern (0-based): MLA at every `period`-th layer (i % period == period-1) and the last one.

    Returns (kda_layer_ids, mla_layer_ids). For 93 layers: 69 KDA and 24 MLA, the last two MLA.
    """
    mla = tuple(i for i in range(num_layers) if i % period == period - 1 or i == num_layers - 1)
    kda = tuple(i for i in range(num_layers) if i not in mla)
    return kda, mla


def k3_full() -> K3Config:
    kda_ids, mla_ids = k3_layer_split(93)
    return K3Config(
        name="k3-full",
        hidden_size=7168,
        num_layers=93,
        vocab_size=163840,
        rms_norm_eps=1e-5,
        max_position_embeddings=1048576,
        tie_word_embeddings=False,
        tokens=TokenIds(bos=163584, eos=163586, pad=163839),
        kda=KDAConfig(num_heads=96, head_dim=128, conv_kernel_size=4, gate_lower_bound=-5.0,
                      use_full_rank_gate=True, layer_ids=kda_ids),
        mla=MLAConfig(num_heads=96, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                      v_head_dim=128, use_nope=True, use_output_gate=True, lora_norm_eps=1e-6, layer_ids=mla_ids),
        moe=MoEConfig(num_experts=896, num_experts_per_token=16, num_shared_experts=2, moe_intermediate_size=3072,
                      routed_expert_hidden_size=3584, latent_moe_use_norm=True, router_activation="sigmoid",
                      topk_method="noaux_tc", num_expert_group=1, topk_group=1, renormalize=True,
                      routed_scaling_factor=1.0, first_k_dense_replace=1, moe_layer_freq=1,
                      dense_intermediate_size=33792),
        attn_res=AttnResConfig(block_size=12),
        situ=SiTUConfig(beta=4.0, linear_beta=25.0),
        quant=QuantConfig(method="mxfp4", group_size=32, ignore=MXFP4_IGNORE),
    )


# k3-tiny keeps K3's control-token layout: BPE ranks first, then 256 control slots.
TINY_BPE_RANKS = 768
TINY_VOCAB = TINY_BPE_RANKS + 256


def k3_tiny() -> K3Config:
    """9 layers (KDA 0,1,2,4,5,6; MLA 3,7,8), dense layer 0, 8 routed + 2 shared experts, 3 AttnRes blocks."""
    kda_ids, mla_ids = k3_layer_split(9)
    return K3Config(
        name="k3-tiny",
        hidden_size=128,
        num_layers=9,
        vocab_size=TINY_VOCAB,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,  # NoPE MLA: positionless; long enough for 100K-token sessions
        tie_word_embeddings=False,
        tokens=TokenIds(bos=TINY_BPE_RANKS + 0, eos=TINY_BPE_RANKS + 2, pad=TINY_BPE_RANKS + 255),
        kda=KDAConfig(num_heads=4, head_dim=32, conv_kernel_size=4, gate_lower_bound=-5.0,
                      use_full_rank_gate=True, layer_ids=kda_ids),
        mla=MLAConfig(num_heads=4, q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                      v_head_dim=32, use_nope=True, use_output_gate=True, lora_norm_eps=1e-6, layer_ids=mla_ids),
        moe=MoEConfig(num_experts=8, num_experts_per_token=2, num_shared_experts=2, moe_intermediate_size=64,
                      routed_expert_hidden_size=64, latent_moe_use_norm=True, router_activation="sigmoid",
                      topk_method="noaux_tc", num_expert_group=1, topk_group=1, renormalize=True,
                      routed_scaling_factor=1.0, first_k_dense_replace=1, moe_layer_freq=1,
                      dense_intermediate_size=256),
        attn_res=AttnResConfig(block_size=4),
        situ=SiTUConfig(beta=4.0, linear_beta=25.0),
        quant=QuantConfig(method="mxfp4", group_size=32, ignore=MXFP4_IGNORE),
    )


# k3-tiny-pp: the vocabulary covers the token ids SGLang's dynamic-chunking profiler feeds (0..9999).
TINY_PP_VOCAB = 10240


def k3_tiny_pp() -> K3Config:
    """Benchmark-only (`k3 bench pp-prefill`): k3-tiny's widths with 16 layers (KDA x3 + MLA, four times: MLA 3, 7,
    11, 15), so PP2 (8, 8) and PP4 (4 x 4) stages hold the same layers, and a 10,240-token vocabulary.

    MLA has 8 heads (k3-tiny: 4) so that attention's quadratic cost is a larger share of a few-K-token prefill, as
    it is for K3 at long context: SGLang's dynamic-chunking predictor fits that term on prefills of up to 1.25x the
    base chunk and turns itself off when it comes out non-positive (measured on 2 shared cores: with 4 or 8 heads
    at a 2048 base it does; 8 heads at a 4096 base fit)."""
    import dataclasses

    tiny = k3_tiny()
    kda_ids, mla_ids = k3_layer_split(16)
    bpe = TINY_PP_VOCAB - 256
    return dataclasses.replace(
        tiny, name="k3-tiny-pp", num_layers=16, vocab_size=TINY_PP_VOCAB,
        tokens=TokenIds(bos=bpe + 0, eos=bpe + 2, pad=bpe + 255),
        kda=dataclasses.replace(tiny.kda, layer_ids=kda_ids),
        mla=dataclasses.replace(tiny.mla, num_heads=8, layer_ids=mla_ids))


def k3_tiny_8h() -> K3Config:
    """Test-only (`tests/e2e/test_tp_dcp_slow.py`): k3-tiny with 8 KDA and 8 MLA heads, so that --tp-size 8
    --dcp-size 8 divides every head count."""
    import dataclasses

    tiny = k3_tiny()
    return dataclasses.replace(tiny, name="k3-tiny-8h", kda=dataclasses.replace(tiny.kda, num_heads=8),
                               mla=dataclasses.replace(tiny.mla, num_heads=8))


PRESETS = {"k3-full": k3_full, "k3-tiny": k3_tiny, "k3-tiny-pp": k3_tiny_pp, "k3-tiny-8h": k3_tiny_8h}
