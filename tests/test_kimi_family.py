"""A Kimi-K2.5-style target (multimodal wrapper + DeepSeek-V3 language model with MLA and MoE), made by
tools/tiny_kimi.py: its dir passes the model-dir checks, the taps, SGLang ids and drafter come from the
language model through `text_config`, the drafter's borrowed tensors are found under the wrapper's names,
and transformers' own Kimi-K2.5 class computes for a text-only prompt exactly the hidden states of the
language model alone (the CPU half of issue 28's proof (a); the SGLang half: bench/gpu/kimi_wrapped.py)."""

from __future__ import annotations

import pytest
import tiny_kimi  # tools/ is on sys.path (pyproject pythonpath)
import torch

from eyas.core.layer_ids import (
    default_aux_layer_ids,
    resolve_aux_layer_ids,
    sglang_captured_inputs,
    sglang_layer_ids,
    text_model_type,
)
from eyas.core.model_dir import check_model_dir
from eyas.core.provenance import model_hash
from eyas.model.drafter import DrafterConfig
from eyas.model.target import load_embed_and_head, load_target_tensor, read_config
from eyas.store import ProvenanceError, check_provenance

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict:
    return tiny_kimi.write_family(tmp_path_factory.mktemp("kimi_family"))


@pytest.mark.parametrize("backend", ["hf", "sglang"])
def test_model_dir_checks_pass_for_the_wrapper_and_the_language_model(family, backend):
    check_model_dir(family["wrapped"], backend)
    check_model_dir(family["lm"], backend)


def test_taps_and_sglang_ids_come_from_the_language_model(family):
    wrapped, lm = read_config(family["wrapped"]), read_config(family["lm"])
    assert "num_hidden_layers" not in wrapped and wrapped["text_config"]["num_hidden_layers"] == 8
    taps = resolve_aux_layer_ids(wrapped, None)
    assert taps == resolve_aux_layer_ids(lm, None) == default_aux_layer_ids(8) == [1, 3, 4]
    assert text_model_type(wrapped) == text_model_type(lm) == "deepseek_v3"
    ids = sglang_layer_ids(text_model_type(wrapped), taps)
    # DeepSeek/Kimi: SGLang adds 1 only because ids[0] == 1, capturing hidden_states[2, 4, 5]
    assert ids == [1, 3, 4] and sglang_captured_inputs("deepseek_v3", ids) == [2, 4, 5]
    assert sglang_layer_ids("deepseek_v3", [2, 3, 4]) == [3, 4, 5]  # ids[0] != 1: taken as they are


def test_the_drafter_of_a_wrapped_mla_target_is_mla_with_its_dims(family):
    cfg = DrafterConfig.from_target_config(read_config(family["wrapped"]), 1000, [1, 3, 4], attention="auto")
    text = tiny_kimi.TEXT_CONFIG
    assert cfg.attention == "mla" and cfg.hidden_size == text["hidden_size"]
    dims = (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim)
    assert dims == (1536, 512, 128, 64, 128)
    assert cfg.rope_scaling is None  # the target's yarn is not the draft's (plain RoPE at its theta)


def test_borrowed_tensors_are_found_under_the_wrappers_names(family):
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(
            load_target_tensor(family["wrapped"], name), load_target_tensor(family["lm"], name)
        )
    embed, head = load_embed_and_head(family["wrapped"])
    assert embed.shape == head.shape == (tiny_kimi.VOCAB, 256) and not torch.equal(embed, head)
    with pytest.raises(KeyError, match="no tensor 'model.nope.weight'"):
        load_target_tensor(family["wrapped"], "model.nope.weight")


def test_a_store_of_the_language_model_is_refused_for_the_wrapper(family):
    """Stores record model_hash (config.json + weight headers): the wrapper and its bare language model
    differ, so a consumer expecting one refuses the other's stores, naming the field."""
    assert model_hash(family["wrapped"]) != model_hash(family["lm"])
    with pytest.raises(ProvenanceError, match="model_hash"):
        check_provenance(
            {"model_hash": model_hash(family["lm"])}, {"model_hash": model_hash(family["wrapped"])}, "x"
        )


def test_transformers_kimi_k25_text_forward_equals_its_language_model(family):
    """transformers (5.25 here) ships Kimi-K2.5; loaded from the wrapper dir, a text-only prompt's hidden
    states at every layer (fp32) are exactly those of the DeepSeek-V3 dir alone: same tensors, and the
    wrapper adds nothing on the text path."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "AutoModelForImageTextToText"):
        pytest.skip("this transformers has no image-text-to-text auto class")
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    try:
        wrapped, info = AutoModelForImageTextToText.from_pretrained(
            family["wrapped"], dtype=torch.float32, output_loading_info=True
        )
    except ValueError as err:  # a transformers without kimi_k25
        pytest.skip(f"transformers cannot build kimi_k25: {err}")
    assert not any(info.values()), info  # every tensor of the dir used, none missing
    lm, info = AutoModelForCausalLM.from_pretrained(
        family["lm"], dtype=torch.float32, output_loading_info=True
    )
    assert not any(info.values()), info
    ids = torch.randint(0, tiny_kimi.VOCAB - 1, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = wrapped(input_ids=ids, output_hidden_states=True)
        b = lm(input_ids=ids, output_hidden_states=True)
    assert len(a.hidden_states) == len(b.hidden_states) == 9
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states, strict=True)):
        assert torch.equal(x, y), i
    assert torch.equal(a.logits, b.logits)
    assert float((b.hidden_states[2] - b.hidden_states[1]).abs().mean()) > 0.1  # the layers do move the state
