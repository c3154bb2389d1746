"""DSpark-style draft checkpoint loader on a tiny random checkpoint written here; bad checkpoints -> clear errors."""
import json
import math

import pytest
import torch
from safetensors.torch import save_file

from k3_sglang.spec.drafters.draft_checkpoint import DraftCheckpointConfig, load_draft_checkpoint

V, H, R, GAMMA = 16, 8, 16, 4
CONFIG = {
    "architectures": ["DSparkDraftModel"], "hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 12, "vocab_size": V, "rms_norm_eps": 1e-6,
    "dflash_config": {"block_size": GAMMA, "mask_token_id": 15, "target_layer_ids": [1, 3]},
    "markov_rank": R, "markov_head_type": "vanilla", "enable_confidence_head": True,
}


def _write(tmp_path, config=None, mutate=None, with_heads=True):
    cfg = DraftCheckpointConfig.from_dict(config or CONFIG)
    g = torch.Generator().manual_seed(0)
    tensors = {("model." + n if n.startswith("layers.0") else n): torch.randn(*s, generator=g) * 0.3
               for n, s in cfg.expected_shapes().items()}
    if with_heads:
        tensors["embed_tokens.weight"] = torch.randn(V, H, generator=g)
        tensors["lm_head.weight"] = torch.randn(V, H, generator=g) * 0.1
    if mutate:
        mutate(tensors)
    (tmp_path / "config.json").write_text(json.dumps(config or CONFIG))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


def test_tiny_random_checkpoint_drafts_tokens_and_confidence(tmp_path):
    draft = load_draft_checkpoint(_write(tmp_path))
    c = draft.config
    assert (c.gamma, c.num_context_features, c.mask_token_id, c.confidence_with_markov) == (GAMMA, 2, 15, True)
    hidden = torch.randn(5, 2 * H)
    anchors = torch.tensor([0, 3, 7, 9, 14])
    tokens, conf = draft(hidden, anchors)
    assert tokens.shape == conf.shape == (5, GAMMA) and tokens.dtype == torch.int64
    assert ((tokens >= 0) & (tokens < V)).all()
    assert torch.isfinite(conf).all() and ((conf > 0) & (conf < 1)).all()
    again = draft(hidden, anchors)
    assert torch.equal(again[0], tokens) and torch.equal(again[1], conf)
    with pytest.raises(ValueError, match="target_hidden"):
        draft(torch.randn(5, H), anchors)


def test_markov_chain_and_confidence_head_are_wired(tmp_path):
    def mutate(t):
        t["markov_head.markov_w1.weight"] = torch.eye(V)
        t["markov_head.markov_w2.weight"] = torch.roll(torch.eye(V), 1, dims=0) * 100.0  # bias -> (prev + 1) % V
        t["confidence_head.proj.weight"] = torch.zeros(1, H + R)
        t["confidence_head.proj.bias"] = torch.tensor([math.log(0.8 / 0.2)])

    draft = load_draft_checkpoint(_write(tmp_path, mutate=mutate))
    tokens, conf = draft(torch.randn(3, 2 * H), torch.tensor([0, 5, 14]))
    assert tokens.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9], [15, 0, 1, 2]]
    torch.testing.assert_close(conf, torch.full((3, GAMMA), 0.8), rtol=0, atol=1e-6)


def test_shared_heads_can_come_from_the_target(tmp_path):
    path = _write(tmp_path, with_heads=False)
    with pytest.raises(ValueError, match="embed_tokens.weight is neither"):
        load_draft_checkpoint(path)
    draft = load_draft_checkpoint(path, embed_weight=torch.randn(V, H), lm_head_weight=torch.randn(V, H))
    assert draft(torch.randn(1, 2 * H), torch.tensor([1]))[0].shape == (1, GAMMA)


@pytest.mark.parametrize("drop, match", [
    ("vocab_size", "missing keys vocab_size"),
    ("dflash_config", "missing keys block_size, mask_token_id, target_layer_ids"),
    ("markov_rank", "missing keys markov_rank"),
])
def test_config_missing_keys(drop, match):
    cfg = dict(CONFIG)
    del cfg[drop]
    with pytest.raises(ValueError, match=match):
        DraftCheckpointConfig.from_dict(cfg)


def test_config_bad_values():
    with pytest.raises(ValueError, match="markov_head_type 'rnn' not supported"):
        DraftCheckpointConfig.from_dict({**CONFIG, "markov_head_type": "rnn"})
    with pytest.raises(ValueError, match="confidence head is required"):
        DraftCheckpointConfig.from_dict({**CONFIG, "enable_confidence_head": False})
    with pytest.raises(ValueError, match="mask_token_id 99 outside vocab"):
        DraftCheckpointConfig.from_dict({**CONFIG, "mask_token_id": 99, "dflash_config": {
            "block_size": 4, "target_layer_ids": [1]}})
    with pytest.raises(ValueError, match="invalid shapes"):
        DraftCheckpointConfig.from_dict({**CONFIG, "num_key_value_heads": 3})
    # dspark_* prefixed keys win over nested ones, which win over top-level ones, as in SGLang
    assert DraftCheckpointConfig.from_dict({**CONFIG, "dspark_block_size": 6}).gamma == 6
    assert DraftCheckpointConfig.from_dict({**CONFIG, "block_size": 9}).gamma == GAMMA
    cfg = {k: v for k, v in CONFIG.items() if k != "dflash_config"}
    cfg.update(block_size=5, dspark_mask_token_id=2, dspark_target_layer_ids=[0])
    assert DraftCheckpointConfig.from_dict(cfg).gamma == 5


def test_bad_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_draft_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_draft_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ValueError, match="not JSON"):
        load_draft_checkpoint(str(tmp_path))

    def drop_conf(t):
        del t["confidence_head.proj.bias"]

    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match=r"missing tensors \['confidence_head.proj.bias'\]"):
        load_draft_checkpoint(_write(tmp_path / "a", mutate=drop_conf))

    def reshape(t):
        t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, H)

    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match=r"wrong shapes: layers.0.self_attn.k_proj.weight \(8, 8\) != \(4, 8\)"):
        load_draft_checkpoint(_write(tmp_path / "b", mutate=reshape))

    def extra(t):
        t["layers.2.mlp.up_proj.weight"] = torch.zeros(12, H)

    (tmp_path / "c").mkdir()
    with pytest.raises(ValueError, match=r"unexpected tensors \['layers.2.mlp.up_proj.weight'\]"):
        load_draft_checkpoint(_write(tmp_path / "c", mutate=extra))

    def poison(t):
        t["fc.weight"][0, 0] = float("nan")

    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="non-finite values in \\['fc.weight'\\]"):
        load_draft_checkpoint(_write(tmp_path / "d", mutate=poison))
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "e" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read"):
        load_draft_checkpoint(str(tmp_path / "e"))
