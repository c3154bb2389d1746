"""Latent MoE family: SiTU, noaux_tc routing, the routed latent-MoE reference."""
from k3_sglang.kernels.moe.naive import latent_moe, noaux_tc_route, situ, situ_mlp

__all__ = ["latent_moe", "noaux_tc_route", "situ", "situ_mlp"]
