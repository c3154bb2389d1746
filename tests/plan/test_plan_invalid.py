"""Plans that cannot work fail with the constraint's name and the size of the violation."""

from __future__ import annotations

import pytest

from k3_sglang.plan import PlanError
from plan_helpers import plan_for


def _fails(constraint: str, *fragments: str, **kwargs) -> PlanError:
    with pytest.raises(PlanError) as info:
        plan_for(**kwargs)
    assert info.value.constraint == constraint, str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)
    return info.value


def test_dcp_must_divide_attention_tp():
    _fails("dcp-divides-attn-tp", "dcp=3", "attention-TP size 8", "8 % 3 = 2", groups=[{"tp": 8, "dcp": 3}])


def test_dcp_must_divide_attention_tp_under_dp_attention():
    _fails("dcp-divides-attn-tp", "attention-TP size 2", "tp 8 / dp_attention 4",
           groups=[{"tp": 8, "dcp": 8, "dp_attention": 4}])


def test_layer_partition_must_cover_the_model():
    _fails("pp-layers", "covers 92 layers", "93", "1 layer(s) short",
           groups=[{"tp": 1, "pp": 8, "pp_layer_partition": [11, 11, 11, 11, 12, 12, 12, 12]}])
    _fails("pp-layers", "9 entries for pp=8", groups=[{"tp": 1, "pp": 8, "pp_layer_partition": [10] * 9}])


def test_weights_must_fit():
    err = _fails("weights-fit", "short by", "H200 has 140.0 GiB", system="h200-8x", groups=[{"tp": 8, "ep": 8}])
    assert "GiB of weights" in str(err)


def test_dequantised_experts_do_not_fit_two_h200_nodes():
    _fails("weights-fit", "keep the experts in MXFP4", system="h200-16x", groups=[{"tp": 16, "ep": 16}],
           precision={"experts": "bf16"})


def test_gpu_count_is_checked_with_the_shortfall():
    _fails("gpu-count", "needs 80 GPUs", "short by 8", groups=[{"tp": 8, "ep": 8, "replicas": 10}])


def test_heads_and_experts_divisibility():
    _fails("heads-divisible", "KDA num_heads=96", groups=[{"tp": 64, "ep": 64}])
    _fails("ep-divides-tp", "ep=3", groups=[{"tp": 8, "ep": 3}])


def test_group_must_fill_whole_hosts():
    _fails("group-placement", "6 GPUs", groups=[{"tp": 2, "pp": 3}])


def test_pd_dcp_transition():
    _fails("pd-dcp", "prefill dcp=4", groups=[{"role": "prefill", "tp": 8, "dcp": 4},
                                               {"role": "decode", "tp": 8, "dcp": 8}])


@pytest.mark.parametrize("doc_patch, field", [
    ({"groups": [{"tp": -8}]}, "groups[0].tp"),
    ({"groups": [{"tp": "eight"}]}, "groups[0].tp"),
    ({"precision": {"kv_cache": "fp16"}}, "precision.kv_cache"),
    ({"precision": {"experts": "int4"}}, "precision.experts"),
    ({"workload": {"context_length": 0}}, "workload.context_length"),
    ({"workload": {"sessions": True}}, "workload.sessions"),
    ({"serving": {"mem_fraction_static": 1.5}}, "serving.mem_fraction_static"),
    ({"serving": {"mamba_full_memory_ratio": -1}}, "serving.mamba_full_memory_ratio"),
    ({"system": "dgx-1"}, "system"),
    ({"system": {"preset": "h200-8x", "gpu_memory_gib": -1}}, "system.gpu_memory_gib"),
    ({"groups": [{"tpp": 8}]}, "groups[0].tpp"),
    ({"groups": [{"role": "prefill", "tp": 8}]}, "groups"),
])
def test_bad_fields_are_named(doc_patch, field):
    from k3_sglang.plan import spec_from_dict

    doc = {"system": "gb300-nvl72", "groups": [{"tp": 8}], **doc_patch}
    with pytest.raises(ValueError) as info:
        spec_from_dict(doc)
    assert str(info.value).startswith(field), str(info.value)
