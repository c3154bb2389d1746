"""The dispatch layer: device defaults, explicit backends, clear errors; only the ops a server calls remain."""
import pytest
import torch

from k3_sglang.kernels import dispatch
from k3_sglang.kernels.mla.dcp_torch import mla_dcp_attention_torch
from k3_sglang.kernels.mla.naive import merge_attention_states
from tests.utils.numerics import FP32_VS_FP64, assert_close


def test_dispatch_defaults_and_errors():
    assert dispatch.resolve("mla_dcp", torch.device("cpu")) is mla_dcp_attention_torch
    assert dispatch.resolve("merge_attention_states", torch.device("cpu")) is merge_attention_states
    assert dispatch.REGISTRY.ops() == ("merge_attention_states", "mla_dcp")
    assert dispatch.REGISTRY.backends("mla_dcp") == ("torch", "triton")
    with pytest.raises(ValueError, match="has no backend 'cuda-graph'; supported: torch, triton"):
        dispatch.resolve("mla_dcp", torch.device("cpu"), "cuda-graph")
    with pytest.raises(ValueError, match="unknown kernel op 'kda_decode'; supported: merge_attention_states, mla_dcp"):
        dispatch.resolve("kda_decode", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown kernel backend 'cutlass'"):
        dispatch.REGISTRY.register("x", "cutlass", "a:b")


@pytest.mark.triton
def test_dispatch_triton_on_cpu_interpreter():
    outs, lses = torch.randn(3, 2, 4, 16), torch.randn(3, 2, 4)
    lses[1, 0] = float("-inf")  # a rank that holds no key of that row
    o, lse = dispatch.merge_attention_states(outs, lses, backend="triton")
    o_ref, lse_ref = merge_attention_states(outs.double(), lses.double())
    assert_close("triton merge", o_ref, o, FP32_VS_FP64)
    assert_close("triton merge lse", lse_ref, lse, FP32_VS_FP64)
