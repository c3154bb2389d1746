"""K3_CSV refuses, before any server starts, a model or backend that does not honour SGLang's verify contract
(spec/contract.py `contract_refusals`): at `k3 serve` (exit 2, the reason named, SGLang never exec'd), in SGLang's
launcher (the algorithm's validate_server_args) and in the worker for a model a hub id hid from both."""
from __future__ import annotations

import json
import os
import types

import pytest

from k3_sglang.cli import main
from k3_sglang.config import preset
from k3_sglang.spec.algo import validate_server_args
from k3_sglang.spec.contract import check_loaded_model, contract_refusals

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}


def _checkpoint(tmp_path, name: str, config: dict):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _k3(tmp_path, name="k3", architectures=None, size="k3-tiny"):
    config = preset(size).to_hf()
    if architectures is not None:
        config["architectures"] = architectures  # a stand-in: K3's config under another model class
    return _checkpoint(tmp_path, name, config)


def _args(path, **kw):
    base = dict(model_path=str(path), pp_size=1, speculative_num_draft_tokens=8, speculative_eagle_topk=1,
                attention_backend=None, decode_attention_backend=None)
    return types.SimpleNamespace(**{**base, **kw})


def test_a_non_k3_model_is_refused_with_its_architecture(tmp_path):
    llama = _checkpoint(tmp_path, "llama", LLAMA)
    [reason] = contract_refusals(_args(llama))
    assert "K3_CSV" in reason and "LlamaForCausalLM" in reason and "KimiK3ForConditionalGeneration" in reason
    assert contract_refusals(_args(_k3(tmp_path))) == []
    assert contract_refusals(_args(_k3(tmp_path, "k3-linear", ["KimiK3LinearForCausalLM"]))) == []
    assert contract_refusals(_args("moonshotai/Some-Hub-Id")) == []  # the worker checks it
    [reason] = contract_refusals(_args(_checkpoint(tmp_path, "bare", {"model_type": "x"})))
    assert "architectures: none" in reason


def test_sglang_k3_needs_a_backend_that_reads_the_ragged_verify_layout(tmp_path):
    k3 = _k3(tmp_path)
    for field, flag in (("attention_backend", "--attention-backend"),
                        ("decode_attention_backend", "--decode-attention-backend")):
        [reason] = contract_refusals(_args(k3, **{field: "triton"}))
        assert f"{flag} triton" in reason and "ragged verify layout" in reason
    for backend in ("k3_cpu_mla", "flashinfer", "trtllm_mla", "fa3", None):
        assert contract_refusals(_args(k3, attention_backend=backend)) == []


def test_sglangs_launcher_refuses_before_any_worker(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        validate_server_args(_args(_checkpoint(tmp_path, "llama", LLAMA)))
    with pytest.raises(ValueError, match="--attention-backend flashmla"):
        validate_server_args(_args(_k3(tmp_path), attention_backend="flashmla"))
    assert validate_server_args(_args(tmp_path / "k3")) is None


def test_the_worker_refuses_a_model_the_start_could_not_read():
    with pytest.raises(ValueError, match="MixtralForCausalLM"):
        check_loaded_model(types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=["MixtralForCausalLM"])))
    check_loaded_model(types.SimpleNamespace(hf_config=types.SimpleNamespace(
        architectures=["KimiK3ForConditionalGeneration"])))


@pytest.fixture
def launched(monkeypatch, tmp_path):
    """Record the exec instead of starting SGLang."""
    calls = []
    monkeypatch.setattr(os, "execvpe", lambda file, command, env: calls.append(list(command)))
    for name in ("SGLANG_PLATFORM", "K3_MODEL_IMPL", "SGLANG_EXTERNAL_MODEL_PACKAGE"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_k3_serve_exits_2_naming_the_model_on_cpu(tmp_path, monkeypatch, launched, capsys):
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: False)
    stand_in = _k3(tmp_path, architectures=["DeepseekV3ForCausalLM"])
    assert main(["serve", "--model-path", str(stand_in), "--speculative-algorithm", "K3_CSV"]) == 2
    err = capsys.readouterr().err
    assert "--speculative-algorithm K3_CSV" in err and "DeepseekV3ForCausalLM" in err
    assert not launched
    assert main(["serve", "--model-path", str(_k3(tmp_path, "real")), "--speculative-algorithm", "K3_CSV"]) == 0
    assert len(launched) == 1


def test_k3_serve_on_cuda_checks_sglangs_k3_backend(tmp_path, monkeypatch, launched, capsys):
    monkeypatch.setattr("k3_sglang.platform.cuda_available", lambda: True)
    full = _k3(tmp_path, "Kimi-K3", size="k3-full")
    assert main(["serve", "--model-path", str(full), "--speculative-algorithm", "K3_CSV",
                 "--attention-backend", "flashmla"]) == 2
    assert "--attention-backend flashmla" in capsys.readouterr().err and not launched
    assert main(["serve", "--model-path", str(full), "--speculative-algorithm", "K3_CSV",
                 "--attention-backend", "trtllm_mla"]) == 0
    assert len(launched) == 1
