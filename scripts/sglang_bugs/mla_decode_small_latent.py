"""Reproducer: SGLang 0.5.23's Triton MLA decode cannot run a latent whose nope part is not 512 or 256.

`sglang.kernels.ops.attention.decode_attention._decode_grouped_att_m_fwd` splits the cache row of width Lk into
BLOCK_DMODEL (the latent, which for MLA is also V) and BLOCK_DPE (the rope part) only for Lk = 576 (512 + 64) and
Lk = 288 (256 + 32); any other Lk gets BLOCK_DMODEL = next_power_of_2(Lk), BLOCK_DPE = 0. The MLA kernel then
reads V as the K tile (`v = tl.trans(k)`, [BLOCK_N, BLOCK_DMODEL]) and accumulates it into acc [BLOCK_H,
BLOCK_DV = next_power_of_2(Lv)], so for kv_lora_rank 64 + rope 16 (Lk = 80: BLOCK_DMODEL 128 vs BLOCK_DV 64) the
shapes of the P.V dot and the accumulator disagree and the kernel does not compile. Any MLA model with a small
latent (test and draft models; kv_lora_rank 128 + 64 as well) hits it on GPU too.

Run on a GPU, or on CPU with TRITON_INTERPRET=1:  python scripts/sglang_bugs/mla_decode_small_latent.py
Exit status 1 and "REPRODUCED" when Lk = 80 fails (or gives a wrong result) while the 576 control is right.
"""
from __future__ import annotations

import sys

import torch


def run(kv_lora: int, rope: int, heads: int = 4, seq: int = 37) -> str:
    """'ok', 'wrong' or the error, for one decode of `heads` heads over `seq` cached rows against plain attention."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    lk = kv_lora + rope
    q = torch.randn(1, heads, lk, generator=gen).to(device, dtype)
    k = torch.randn(seq, 1, lk, generator=gen).to(device, dtype)
    v = k[..., :kv_lora]
    o = torch.zeros(1, heads, kv_lora, device=device, dtype=dtype)
    splits = 4
    logits = torch.zeros(1, heads, splits, kv_lora, device=device, dtype=torch.float32)
    lse = torch.zeros(1, heads, splits, device=device, dtype=torch.float32)
    indptr = torch.tensor([0, seq], device=device, dtype=torch.int32)
    indices = torch.arange(seq, device=device, dtype=torch.int32)
    num_splits = torch.full((1,), splits, device=device, dtype=torch.int32)
    scale = lk ** -0.5
    try:
        decode_attention_fwd(q, k, v, o, indptr, indices, logits, lse, num_splits, splits, scale, 1.0, 1.0,
                             has_mla=True)
    except Exception as exc:  # noqa: BLE001 - the failure is the finding
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    p = torch.softmax((q[0].float() @ k[:, 0].float().t()) * scale, -1)
    want = p @ v[:, 0].float()
    return "ok" if torch.allclose(o[0].float(), want, rtol=2e-2, atol=2e-2) else "wrong"


def main() -> int:
    small = run(64, 16)
    print(f"MLA decode, kv_lora_rank 64 + rope 16 (Lk 80): {small}")
    control = run(512, 64)
    print(f"control, kv_lora_rank 512 + rope 64 (Lk 576): {control}")
    if small != "ok" and control == "ok":
        print("REPRODUCED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
