"""K3_CSV on SGLang's verify contract (spec/contract.py) against the installed SGLang: the chain accept index, the
CPU scatter of SGLang's commit (checked against SGLang's own CPU scatter), the hooks the plugin installs on k3_cpu,
and SGLang's commit entry point driven end to end on a real SpeculativeState-shaped pool."""
from __future__ import annotations

import inspect
import pkgutil
import types

import pytest
import torch

from k3_sglang.spec import contract


def test_chain_accept_index():
    got = contract.chain_accept_index(torch.tensor([3, 1, 4], dtype=torch.int32), 4)
    assert got.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1], [8, 9, 10, 11]]


def _caches(seed: int, slots: int = 6, rows: int = 7, steps: int = 4, layers: int = 3):
    g = torch.Generator().manual_seed(seed)
    return types.SimpleNamespace(
        temporal=torch.randn(layers, slots, 2, 3, 3, generator=g),
        intermediate_ssm=torch.randn(layers, rows, steps, 2, 3, 3, generator=g),
        conv=[torch.randn(layers, slots, 3, 5, generator=g)],
        intermediate_conv_window=[torch.randn(layers, rows, steps, 3, 5, generator=g)])


def _sglang_scatter(caches, dst_rows, steps, src_rows):
    """SGLang's own CPU fallback of the masked scatter (HybridLinearAttnBackend), for every state pair."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    scatter = HybridLinearAttnBackend._scatter_speculative_state_with_mask
    scatter(caches.temporal, caches.intermediate_ssm, dst_rows, steps, src_rows)
    for conv, window in zip(caches.conv, caches.intermediate_conv_window):
        scatter(conv, window, dst_rows, steps, src_rows)


@pytest.mark.parametrize("stable_rows", [False, True], ids=["row-b", "req-pool-rows"])
def test_cpu_scatter_matches_sglangs_own_cpu_scatter(stable_rows):
    slots, steps = torch.tensor([4, 0, -1, 2]), torch.tensor([2, 0, 1, 3])
    track, track_steps = torch.tensor([5, 1, 3, 3]), torch.tensor([-1, 0, 2, 1])
    src = torch.tensor([6, 2, 0, 3]) if stable_rows else None
    ours, want = _caches(0), _caches(0)
    original_calls = []
    contract.scatter_after_verify(lambda *a: original_calls.append(a), ours, slots, steps, track, track_steps, src)
    rows = src if src is not None else torch.arange(4)
    _sglang_scatter(want, slots, steps, rows)
    _sglang_scatter(want, track, track_steps, rows)
    assert original_calls == []  # CPU pools never reach SGLang's Triton kernels
    assert torch.equal(ours.temporal, want.temporal)
    assert torch.equal(ours.conv[0], want.conv[0])
    untouched = _caches(0)
    assert torch.equal(ours.temporal[:, 5], untouched.temporal[:, 5])  # slot 5: its track step is -1
    assert not torch.equal(ours.temporal[:, 4], untouched.temporal[:, 4])


def test_cpu_scatter_delegates_other_devices_to_sglang():
    meta = types.SimpleNamespace(temporal=torch.empty(1, 1, device="meta"))
    calls = []
    contract.scatter_after_verify(lambda *a: calls.append(a), meta, "idx", "steps", None, None)
    assert len(calls) == 1 and calls[0][:3] == (meta, "idx", "steps")


def test_hook_targets_exist_with_the_parameters_sglang_passes():
    fn = inspect.unwrap(pkgutil.resolve_name(contract.SCATTER_TARGET))
    assert list(inspect.signature(fn).parameters) == [
        "mamba_caches", "state_indices_tensor", "last_correct_step_indices", "mamba_track_indices",
        "mamba_steps_to_track", "src_indices_raw"]
    assert "is_cuda" in inspect.getsource(pkgutil.resolve_name(
        "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask"))
    from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify

    params = list(inspect.signature(commit_mamba_states_after_verify).parameters)
    assert params[:5] == ["target_worker", "batch", "accept_lens", "accept_index", "draft_token_num"]


def test_plugin_lists_every_hook_it_installs(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from k3_sglang.spec import plugin

    registered = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, t, h, k: registered.append((t, h, k.name))))
    monkeypatch.setenv("SGLANG_PLATFORM", "k3_cpu")
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    monkeypatch.delenv("K3_DEPLOYMENT", raising=False)
    monkeypatch.setattr(plugin, "_plain_path_registered", False)
    plugin.register()
    from k3_sglang.spec import plain_path

    assert registered == plain_path.installed_hooks() + plugin.installed_hooks()  # the plain path once per process
    registered.clear()
    plugin.register()
    assert registered == plugin.installed_hooks()
    for target, _, _ in plugin.installed_hooks():
        pkgutil.resolve_name(target)  # every target exists in the installed SGLang
    monkeypatch.setenv("SGLANG_PLATFORM", "cuda")
    monkeypatch.delenv("K3_SERVE_HOOKS", raising=False)
    monkeypatch.setattr(plugin, "_plain_path_registered", False)
    registered.clear()
    plugin.register()
    assert registered == []  # a GPU host without `k3 serve` is untouched


def test_sglangs_commit_through_the_contract_commits_the_accepted_steps(monkeypatch):
    """spec/contract.commit_after_verify -> SGLang's commit_mamba_states_after_verify -> the hybrid backend's
    update_mamba_state_after_mtp_verify -> the (CPU) scatter: each request's slot gets its scratch step
    accept_len - 1, from the forward's mamba slots; the scratch rows are the requests' order."""
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as scatter_module
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid

    caches = _caches(1)
    before = _caches(1)
    original = scatter_module.scatter_mamba_states_after_mtp_verify
    monkeypatch.setattr(hybrid, "scatter_mamba_states_after_mtp_verify",
                        lambda *a, **k: contract.scatter_after_verify(original, *a, **k))
    backend = hybrid.HybridLinearAttnBackend.__new__(hybrid.HybridLinearAttnBackend)
    pool = types.SimpleNamespace(get_speculative_mamba2_params_all_layers=lambda: caches,
                                 mamba_pool=types.SimpleNamespace(), short_conv_pool=types.SimpleNamespace(
                                     conv_state=None, intermediate_conv_state=None),
                                 ngram_pool=types.SimpleNamespace(context=None, intermediate_context=None))
    backend.linear_attn_backend = types.SimpleNamespace(
        req_to_token_pool=pool, accept_lens_pool=None,
        forward_metadata=types.SimpleNamespace(mamba_cache_indices=torch.tensor([5, 2, 0])))
    runner = types.SimpleNamespace(attn_backend=backend, model_config=object(), req_to_token_pool=pool, model=None)
    monkeypatch.setattr("sglang.srt.speculative.spec_utils.mambaish_config", lambda cfg: True)
    monkeypatch.delenv("SGLANG_ENABLE_PP_SPEC", raising=False)
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False), mamba_track_indices=None,
                                  req_pool_indices=torch.tensor([9, 8, 7]), seq_lens=torch.tensor([10, 20, 30]))
    accept = torch.tensor([3, 1, 4], dtype=torch.int32)
    index = contract.commit_after_verify(types.SimpleNamespace(model_runner=runner), batch, accept, 4)
    assert index.tolist() == contract.chain_accept_index(accept, 4).tolist()
    for row, (slot, n) in enumerate(zip([5, 2, 0], accept.tolist())):
        assert torch.equal(caches.temporal[:, slot], before.intermediate_ssm[:, row, n - 1])
        assert torch.equal(caches.conv[0][:, slot], before.intermediate_conv_window[0][:, row, n - 1])
    for slot in (1, 3, 4):
        assert torch.equal(caches.temporal[:, slot], before.temporal[:, slot])
