"""Shared builders for the pooled KDA tests (not a test module)."""
import torch

from k3_sglang.kernels.kda.decode_common import KDAWeights

POISON = 1e30


def make_weights(H, K, V, W=4, dtype=torch.float32):
    D = 2 * H * K + H * V
    return KDAWeights(conv_weight=torch.randn(D, W, dtype=dtype) * 0.5, A_log=torch.randn(H + 2, dtype=dtype) * 0.5,
                      dt_bias=torch.randn(H * K, dtype=dtype), o_norm=torch.rand(V, dtype=dtype) + 0.5)


def make_step_inputs(B, n, H, K, V, dtype=torch.float32):
    D = 2 * H * K + H * V
    return (torch.randn(B, n, D, dtype=dtype), torch.randn(B, n, H * K, dtype=dtype), torch.randn(B, n, H, dtype=dtype),
            torch.randn(B, n, H * V, dtype=dtype))


def make_pools(num_slots, used, H, K, V, W=4, dtype=torch.float32):
    """Pools whose unused slots hold POISON; used slots get random state and windows."""
    D = 2 * H * K + H * V
    conv = torch.full((num_slots, W - 1, D), POISON, dtype=dtype)
    state = torch.full((num_slots, H, K, V), POISON, dtype=torch.float32)
    idx = torch.as_tensor([s for s in used if s >= 0], dtype=torch.long)
    conv[idx] = torch.randn(len(idx), W - 1, D, dtype=dtype)
    state[idx] = torch.randn(len(idx), H, K, V) * 0.3
    return conv, state


def as64(weights: KDAWeights) -> KDAWeights:
    return KDAWeights(*(t.double() for t in (weights.conv_weight, weights.A_log, weights.dt_bias, weights.o_norm)))
