"""SGLang export: exact keys, shapes, dtypes, bf16-rounded values, config fields, validation."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_drafter import tiny_config  # tests/ is on sys.path (rootdir conftest, no package)

from eyas.export import expected_tensors, export_sglang, load_export, sglang_tensors, validate_tensors
from eyas.model.drafter import DrafterConfig, Eagle3Drafter


def _config(**overrides) -> DrafterConfig:
    fields = dict(rope_theta=1e5, max_position_embeddings=512, aux_layer_ids=[1, 14, 26])
    return tiny_config(**(fields | overrides))


@pytest.fixture()
def drafter_dir(tmp_path):
    cfg = _config()
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    d2t = torch.zeros(40, dtype=torch.int64)
    d2t[10:] = 30
    t2d = torch.zeros(100, dtype=torch.bool)
    t2d[torch.arange(40) + d2t] = True
    model.set_vocab(d2t, t2d)
    model.save_pretrained(tmp_path / "drafter", extra_config={"model_hash": "m", "layer_ids": [1, 14, 26]})
    return tmp_path / "drafter", model


def test_export_keys_shapes_values(drafter_dir, tmp_path):
    src, model = drafter_dir
    summary = export_sglang(src, tmp_path / "sglang")
    weights = load_file(str(tmp_path / "sglang" / "model.safetensors"))
    want = expected_tensors(model.config)
    assert set(weights) == set(want) and "embed_tokens.weight" not in weights
    assert summary["keys"] == 15
    state = model.state_dict()
    for key, (shape, dtype) in want.items():
        assert tuple(weights[key].shape) == shape and weights[key].dtype == dtype, key
        assert torch.equal(weights[key], state[key].to(dtype)), key  # bf16-rounded copy of the drafter's
    assert weights["d2t"][10].item() == 30 and int(weights["t2d"].sum()) == 40

    cfg = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == 100 and cfg["draft_vocab_size"] == 40
    assert cfg["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 14, 26],
        "use_aux_hidden_state": True,
    }
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "bfloat16"
    assert cfg["rope_theta"] == 1e5 and cfg["head_dim"] == 8 and cfg["num_key_value_heads"] == 2
    assert cfg["eyas_provenance"]["model_hash"] == "m"


def test_validation_names_the_key(drafter_dir):
    _, model = drafter_dir
    tensors = sglang_tensors(model)
    validate_tensors(tensors, model.config)
    renamed = dict(tensors)
    renamed["midlayer.hidden_norm.weight"] = renamed.pop("layers.0.hidden_norm.weight")
    with pytest.raises(ValueError, match="layers.0.hidden_norm.weight' missing"):
        validate_tensors(renamed, model.config)
    extra = {**tensors, "embed_tokens.weight": torch.zeros(100, 32, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="unexpected key 'embed_tokens.weight'"):
        validate_tensors(extra, model.config)
    wrong = {**tensors, "lm_head.weight": torch.zeros(41, 32, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="lm_head.weight"):
        validate_tensors(wrong, model.config)
    wrong_dtype = {**tensors, "d2t": tensors["d2t"].int()}
    with pytest.raises(ValueError, match="'d2t'"):
        validate_tensors(wrong_dtype, model.config)


def test_speculators_config_and_layer_id_convention(drafter_dir, tmp_path):
    from eyas.export import export_speculators

    src, model = drafter_dir
    info = export_speculators(
        src, tmp_path / "spec", "org/target", ["LlamaForCausalLM"], speculative_tokens=4
    )
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    # drafter [1, L//2-1, L-4] for L = 30 is vLLM's [2, L//2, L-3]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] == info["eagle_aux_hidden_state_layer_ids"]
    assert cfg["eyas_conversion"]["drafter_aux_layer_ids"] == [1, 14, 26]
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["verifier"] == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}
    assert spec["proposal_methods"][0]["speculative_tokens"] == 4
    layer = cfg["transformer_layer_config"]
    assert layer["num_hidden_layers"] == 1 and layer["vocab_size"] == 100 and cfg["draft_vocab_size"] == 40
    assert cfg["norm_before_residual"] is False
    weights = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert set(weights) == set(expected_tensors(model.config))


@pytest.mark.parametrize("kind", ["sglang", "speculators"])
def test_export_reloads_and_computes_what_the_trained_model_computes(drafter_dir, tmp_path, kind):
    """Each export, rebuilt from its own config + weights, drafts like the trained model (bf16 weights)."""
    from eyas.export import export_speculators, load_export

    src, _ = drafter_dir
    trained = Eagle3Drafter.from_pretrained(src).eval()
    with torch.no_grad():  # weights at the scale real drafters have, so bf16 rounding is realistic
        for p in trained.parameters():
            p.mul_(0.3)
    trained.save_pretrained(tmp_path / "trained")
    out = tmp_path / kind
    if kind == "sglang":
        export_sglang(tmp_path / "trained", out)
    else:
        export_speculators(tmp_path / "trained", out, "org/target", ["LlamaForCausalLM"])
    reloaded = load_export(out, trained.embed_tokens.weight)
    assert reloaded.config == trained.config
    torch.manual_seed(1)
    aux = torch.randn(2, 12, 96)
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        want = trained.ttt_forward(aux, ids, 3)
        got = reloaded.ttt_forward(aux, ids, 3)
    for k in range(3):
        scale = float(want[k].abs().max())  # bf16 export: error relative to the logits' range
        assert float((got[k] - want[k]).abs().max()) <= 0.02 * scale, k
        agree = (got[k].argmax(-1) == want[k].argmax(-1)).float().mean()
        assert agree >= 0.9, (k, float(agree))
    assert torch.equal(reloaded.d2t, trained.d2t) and torch.equal(reloaded.t2d, trained.t2d)


def test_deepseek_family_export_writes_sglang_ids_and_reads_them_back(tmp_path):
    # Taps [2, 14, 26] of a DeepSeek-V3/Kimi target: SGLang adds 1 only when the first id is 1, so the
    # config must say [3, 15, 27] to capture hidden_states[3, 15, 27] = the outputs of layers 2, 14, 26.
    cfg = _config(draft_vocab_size=100, aux_layer_ids=[2, 14, 26])
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    model.save_pretrained(tmp_path / "drafter")
    summary = export_sglang(tmp_path / "drafter", tmp_path / "sglang", target_model_type="deepseek_v3")
    config = json.loads((tmp_path / "sglang" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 15, 27]
    assert summary["sglang_aux_layer_ids"] == [3, 15, 27] and summary["aux_layer_ids"] == [2, 14, 26]
    reloaded = load_export(tmp_path / "sglang", model.embed_tokens.weight.detach())
    assert reloaded.config.aux_layer_ids == [2, 14, 26]
