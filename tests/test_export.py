"""SGLang and speculators exports: exact keys, shapes, dtypes, bf16-rounded values, config fields,
validation, the verifier check. The engines' own loaders are tested in tests/speculators/ and
tests/sglang/ (their own venvs); vLLM's in test_vllm_* below (a table read from its sources)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from modelkit import tiny_drafter_config as tiny_config
from safetensors.torch import load_file

from eyas.core.provenance import model_hash
from eyas.export import (
    check_verifier,
    expected_speculators_tensors,
    expected_tensors,
    export_sglang,
    export_speculators,
    load_export,
    sglang_tensors,
    validate_tensors,
)
from eyas.model.drafter import DrafterConfig, Eagle3Drafter

HUB_VERIFIER = "org/target"  # a well-formed Hub id, not cached here: accepted unchecked


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
    src, model = drafter_dir
    info = export_speculators(
        src, tmp_path / "spec", HUB_VERIFIER, ["LlamaForCausalLM"], speculative_tokens=4
    )
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    # drafter [1, L//2-1, L-4] for L = 30 is vLLM's [2, L//2, L-3]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27] == info["eagle_aux_hidden_state_layer_ids"]
    assert cfg["eyas_conversion"]["drafter_aux_layer_ids"] == [1, 14, 26]
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["verifier"] == {"name_or_path": HUB_VERIFIER, "architectures": ["LlamaForCausalLM"]}
    assert info["verifier_kind"] == "hub" and info["verifier_checked"] is False
    assert spec["proposal_methods"][0]["speculative_tokens"] == 4
    layer = cfg["transformer_layer_config"]
    assert layer["num_hidden_layers"] == 1 and layer["vocab_size"] == 100 and cfg["draft_vocab_size"] == 40
    # every flag vLLM/speculators default is explicit (vLLM 0.33.0 defaults norm_before_residual to true)
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        assert cfg[flag] is False, flag
    assert "model_type" not in cfg  # vLLM detects the speculators format by its absence
    weights = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert (
        set(weights)
        == set(expected_speculators_tensors(model.config))
        == set(expected_tensors(model.config)) | {"embed_tokens.weight"}
    )
    # the embedding the drafter was trained with (the target's), bf16-rounded, never zeros
    embed = weights["embed_tokens.weight"]
    assert embed.dtype == torch.bfloat16 and tuple(embed.shape) == (100, 32)
    assert torch.equal(embed, model.embed_tokens.weight.detach().to(torch.bfloat16))
    assert float(embed.float().abs().sum()) > 0


@pytest.mark.parametrize("kind", ["sglang", "speculators"])
def test_export_reloads_and_computes_what_the_trained_model_computes(drafter_dir, tmp_path, kind):
    """Each export, rebuilt from its own config + weights, drafts like the trained model (bf16 weights)."""
    src, _ = drafter_dir
    trained = Eagle3Drafter.from_pretrained(src).eval()
    with torch.no_grad():  # weights at the scale real drafters have, so bf16 rounding is realistic
        for p in trained.parameters():
            p.mul_(0.3)
    trained.save_pretrained(tmp_path / "trained")
    out = tmp_path / kind
    if kind == "sglang":
        export_sglang(tmp_path / "trained", out)
        reloaded = load_export(out, trained.embed_tokens.weight)
    else:  # the speculators export carries its own embedding
        export_speculators(tmp_path / "trained", out, HUB_VERIFIER, ["LlamaForCausalLM"])
        reloaded = load_export(out)
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


@pytest.mark.parametrize("options", [{}, {"fc_norm": True, "norm_output": True}])
def test_mla_export_keys_config_and_reload(tmp_path, options):
    """The MLA drafter exports as `Eagle3DeepseekV2ForCausalLM` (its keys validated; SGLang's own
    loader in tests/sglang/test_export_mla.py), reloads computing what it computes, and has no
    speculators format."""
    from test_drafter import MLA_LAYER

    cfg = _config(**MLA_LAYER, **options, aux_layer_ids=[1, 14, 26])
    torch.manual_seed(0)
    trained = Eagle3Drafter(cfg).eval()
    with torch.no_grad():
        for p in trained.parameters():
            p.normal_(0, 0.3)
    trained.save_pretrained(tmp_path / "drafter", extra_config={"model_hash": "m", "layer_ids": [1, 14, 26]})
    summary = export_sglang(tmp_path / "drafter", tmp_path / "sglang", target_model_type="kimi_k25")
    config = json.loads((tmp_path / "sglang" / "config.json").read_text())
    weights = load_file(str(tmp_path / "sglang" / "model.safetensors"))
    assert set(weights) == set(expected_tensors(cfg)) and summary["keys"] == len(weights)
    assert ("fc_norm.0.weight" in weights) == bool(options)
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["rope_interleave"]
    assert config["fc_norm"] == config["norm_output"] == bool(options)
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SGLang adds 1 itself
    reloaded = load_export(tmp_path / "sglang", trained.embed_tokens.weight.detach())
    assert reloaded.config == trained.config
    aux, ids = torch.randn(2, 12, 96), torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        want, got = trained.ttt_forward(aux, ids, 3), reloaded.ttt_forward(aux, ids, 3)
    for k in range(3):
        assert float((got[k] - want[k]).abs().max()) <= 0.02 * float(want[k].abs().max()), k
    with pytest.raises(ValueError, match="no speculators format"):
        export_speculators(tmp_path / "drafter", tmp_path / "spec", HUB_VERIFIER, ["LlamaForCausalLM"])


# --------------------------------------------------------------------------- the speculators verifier
def _target_dir(tmp_path, hidden=32, vocab=100, layers=30, weights=True):
    """A stand-in target dir: config.json (+ an empty safetensors file) shaped like the drafter's target."""
    from safetensors.torch import save_file

    d = tmp_path / f"target-{hidden}-{vocab}-{layers}-{weights}"
    d.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden}
    config |= {"vocab_size": vocab, "num_hidden_layers": layers}
    (d / "config.json").write_text(json.dumps(config))
    if weights:
        save_file({"model.norm.weight": torch.ones(hidden)}, str(d / "model.safetensors"))
    return d


def test_verifier_directory_must_be_the_drafters_target(drafter_dir, tmp_path):
    _, model = drafter_dir
    cfg = model.config
    target = _target_dir(tmp_path)
    assert check_verifier(str(target), cfg) == {"name_or_path": str(target), "kind": "path", "checked": True}
    assert check_verifier(str(target), cfg, model_hash(target))["checked"] is True
    with pytest.raises(ValueError, match=r"export\.verifier: .*model_hash differs"):
        check_verifier(str(target), cfg, "another-model")
    for bad, why in (
        (_target_dir(tmp_path, hidden=64), "hidden_size=64"),
        (_target_dir(tmp_path, vocab=101), "vocab_size=101"),
        (_target_dir(tmp_path, layers=20), "taps hidden state 27"),  # vLLM ids [2, 15, 27]
        (_target_dir(tmp_path, weights=False), "no model.safetensors"),
        (tmp_path / "missing" / "model", "path that does not exist"),
    ):
        with pytest.raises(ValueError, match=rf"^export\.verifier: .*{why}"):
            check_verifier(str(bad), cfg)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="export.verifier: .*not a model directory with a config.json"):
        check_verifier(str(tmp_path / "empty"), cfg)


def test_verifier_relative_path_is_refused(drafter_dir, tmp_path, monkeypatch):
    _, model = drafter_dir
    target = _target_dir(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="export.verifier: .*relative path"):
        check_verifier(target.name, model.config)


@pytest.mark.parametrize("name", ["smollm2", "", "org/a/b", "org--x/y", "-org/x", "org/x y"])
def test_verifier_that_cannot_resolve_is_refused_naming_the_key(drafter_dir, tmp_path, name):
    """The issue's case: the project's internal id 'smollm2' is neither a path nor a Hub id."""
    src, _ = drafter_dir
    with pytest.raises(ValueError, match=r"^export\.verifier: .*set export\.verifier to"):
        export_speculators(src, tmp_path / "spec", name, ["LlamaForCausalLM"])
    assert not (tmp_path / "spec").exists()  # nothing written


def test_verifier_hub_id_in_the_local_cache_is_checked(drafter_dir, tmp_path, monkeypatch):
    """A Hub id whose config.json is in the local HF cache is checked like a directory (no network)."""
    pytest.importorskip("huggingface_hub")
    import huggingface_hub

    _, model = drafter_dir
    wrong = _target_dir(tmp_path, hidden=64) / "config.json"
    right = _target_dir(tmp_path) / "config.json"
    cache = {"org/wrong": str(wrong), "org/right": str(right)}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: cache.get(repo))
    assert check_verifier("org/right", model.config) == {
        "name_or_path": "org/right",
        "kind": "hub",
        "checked": True,
    }
    with pytest.raises(ValueError, match="export.verifier: 'org/wrong' is not the drafter's target"):
        check_verifier("org/wrong", model.config)
    assert check_verifier("org/uncached", model.config)["checked"] is False


def test_export_speculators_with_the_target_dir_as_verifier(drafter_dir, tmp_path):
    """The default (null -> the job's model dir, absolute) resolves: the dir is written verbatim; a dir
    that is not the model of the drafter's provenance (fixture: model_hash 'm') is refused."""
    src, model = drafter_dir
    target = _target_dir(tmp_path)
    with pytest.raises(ValueError, match="export.verifier: .*model_hash differs"):
        export_speculators(src, tmp_path / "spec", str(target), ["LlamaForCausalLM"])
    model.save_pretrained(tmp_path / "drafter2", extra_config={"model_hash": model_hash(target)})
    info = export_speculators(tmp_path / "drafter2", tmp_path / "spec", str(target), ["LlamaForCausalLM"])
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(target) == info["verifier"]
    assert info["verifier_kind"] == "path" and info["verifier_checked"] is True


# --------------------------------------------------------------------------- vLLM 0.33.0 (a table)
# vLLM's config code reads the export in tests/speculators/test_vllm_config.py (it imports on CPU); its
# Eagle-3 model class does not (it imports the engine, which pins a CUDA torch 2.14.0). What that class
# does with the weights, as read in the vllm==0.33.0 wheel, restated in this test's own code:
# vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM.load_weights: names holding "t2d"
# are skipped; "d2t" becomes `draft_id_to_target_id`; every other name but lm_head gets a "model."
# prefix; LlamaModel's mapper reads "midlayer." as "layers.0." and stacks q/k/v_proj into qkv_proj,
# gate/up_proj into gate_up_proj. A name that matches no parameter is skipped silently. An
# `embed_tokens` weight marks the drafter as having its own embedding, which the proposer still shares
# with the target when the two are equal (v1/spec_decode/llm_base_proposer.py).
VLLM_STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v")}
VLLM_STACKED |= {".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}
# Eagle3LlamaForCausalLM's parameters for a one-layer llama drafter with aux states, no norm before
# fc, no fc_norm, draft vocab < target vocab: name -> shape as a function of the drafter config.
VLLM_EAGLE3_PARAMS = {
    "model.embed_tokens.weight": lambda c: (c.vocab_size, c.hidden_size),
    "model.fc.weight": lambda c: (c.hidden_size, 3 * c.hidden_size),
    "model.layers.0.self_attn.qkv_proj.weight": lambda c: (
        (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,
        2 * c.hidden_size,
    ),
    "model.layers.0.self_attn.o_proj.weight": lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim),
    "model.layers.0.mlp.gate_up_proj.weight": lambda c: (2 * c.intermediate_size, c.hidden_size),
    "model.layers.0.mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
    "model.layers.0.input_layernorm.weight": lambda c: (c.hidden_size,),
    "model.layers.0.hidden_norm.weight": lambda c: (c.hidden_size,),
    "model.layers.0.post_attention_layernorm.weight": lambda c: (c.hidden_size,),
    "model.norm.weight": lambda c: (c.hidden_size,),
    "lm_head.weight": lambda c: (c.draft_vocab_size, c.hidden_size),
    "draft_id_to_target_id": lambda c: (c.draft_vocab_size,),
}


def vllm_weight_name(name: str) -> tuple[str, str | int | None] | None:
    """Where vLLM 0.33.0's Eagle-3 llama loader puts a checkpoint tensor: (parameter, shard) or None."""
    if "t2d" in name:
        return None
    if "d2t" in name:
        return name.replace("d2t", "draft_id_to_target_id"), None
    if "lm_head" not in name:
        name = "model." + name
    name = name.replace("midlayer.", "layers.0.")
    for old, (new, shard) in VLLM_STACKED.items():
        if old in name:
            return name.replace(old, new), shard
    return name, None


def test_vllm_0_33_loads_every_export_key_into_every_parameter(drafter_dir, tmp_path):
    src, model = drafter_dir
    export_speculators(src, tmp_path / "spec", HUB_VERIFIER, ["LlamaForCausalLM"])
    weights = load_file(str(tmp_path / "spec" / "model.safetensors"))
    cfg = model.config
    shards: dict[str, list] = {}
    for key, tensor in weights.items():
        where = vllm_weight_name(key)
        if where is None:
            assert key == "t2d"  # the one key vLLM skips by design
            continue
        param, shard = where
        assert param in VLLM_EAGLE3_PARAMS, f"{key} -> {param}: no such vLLM parameter (skipped silently)"
        shards.setdefault(param, []).append((shard, tuple(tensor.shape)))
    assert set(shards) == set(VLLM_EAGLE3_PARAMS)  # every parameter receives a tensor
    for param, pieces in shards.items():
        want = VLLM_EAGLE3_PARAMS[param](cfg)
        names = [s for s, _ in pieces]
        if param.endswith("qkv_proj.weight"):
            assert sorted(names) == ["k", "q", "v"]
        elif param.endswith("gate_up_proj.weight"):
            assert sorted(names) == [0, 1]
        else:
            assert names == [None], param
        rows = sum(shape[0] for _, shape in pieces)
        assert (rows, *pieces[0][1][1:]) == want, (param, pieces, want)
    assert weights["d2t"].dtype == torch.int64  # draft_id_to_target_id is a long parameter


def test_rule_script_default_verifier_is_the_absolute_model_dir(drafter_dir, tmp_path):
    """scripts/export_speculators.py as the rule runs it, `export.verifier: null`, a relative model dir:
    the export names the dir's absolute path (speculators resolves it from any working directory)."""
    import subprocess
    import sys

    src, model = drafter_dir
    work = tmp_path / "work"
    target = _target_dir(tmp_path)
    (work / "results" / "assets").mkdir(parents=True)
    target.rename(work / "results" / "assets" / "model")
    model.save_pretrained(
        work / "drafter", extra_config={"model_hash": model_hash(work / "results" / "assets" / "model")}
    )
    script = Path(__file__).parents[1] / "scripts" / "export_speculators.py"
    stub = (
        "import runpy, types\n"
        "ns = types.SimpleNamespace\n"
        "sm = ns(input=ns(drafter='drafter', model='results/assets/model'),"
        " output=ns(export='results/export/speculators'), log=[None],"
        " params=ns(verifier=None, speculative_tokens=4))\n"
        f"runpy.run_path({str(script)!r}, init_globals={{'snakemake': sm}})\n"
    )
    subprocess.run([sys.executable, "-c", stub], cwd=work, check=True, capture_output=True)
    cfg = json.loads((work / "results" / "export" / "speculators" / "config.json").read_text())
    verifier = cfg["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == str(work / "results" / "assets" / "model")
    assert verifier["architectures"] == ["LlamaForCausalLM"]
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
