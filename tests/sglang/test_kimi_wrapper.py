"""The Kimi-K2.5 capture path on the real sglang 0.5.23 classes, on CPU, as far as it runs without a GPU:
tools/tiny_kimi.py's wrapper dir and its bare DeepSeek-V3 language model are read by SGLang's own
`ModelConfig`, built as `KimiK25ForConditionalGeneration` / `DeepseekV3ForCausalLM` (every parameter
filled by their real `load_weights`), take the capture ids eyas computes through the wrapper, and the
wrapper's forward hands a text-only batch to its language model as the plain token embeddings, returning
the language model's output untouched, which is where the aux taps and the final state are produced
(DeepseekV2Model.forward and the logits processor of DeepseekV3ForCausalLM). The forward itself (attention
kernels) and the comparison of captured rows run on the GPU: bench/gpu/kimi_wrapped.py.
"""

from __future__ import annotations

import pytest
import tiny_kimi  # tools/ is on sys.path (pyproject pythonpath)
import torch
from objects import extend_batch, load_into_nan
from sglang.srt.configs.model_config import AttentionArch, ModelConfig
from test_export_load_weights import monkeypatch_module, sglang_cpu_groups  # noqa: F401 (fixtures)

from eyas.core.layer_ids import (
    resolve_aux_layer_ids,
    sglang_captured_inputs,
    sglang_layer_ids,
    text_model_type,
)
from eyas.model.target import read_config


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    return tiny_kimi.write_family(tmp_path_factory.mktemp("tiny_kimi"))


@pytest.fixture(scope="module")
def models(sglang_cpu_groups, dirs, monkeypatch_module):  # noqa: F811 (fixtures by name)
    import sglang.srt.layers.rotary_embedding.base as rope_base
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    # RoPE picks its kernel at construction (see test_export_load_weights.py); the yarn RoPE of the
    # tiny Kimi is DeepSeek's, which SGLang's CPU path builds.
    monkeypatch_module.setattr(rope_base, "_is_cpu", True)
    built = {}
    for name, cls in (("wrapped", KimiK25ForConditionalGeneration), ("lm", DeepseekV3ForCausalLM)):
        # enable_multimodal=False: what the GPU script serves with (no processor can be made locally),
        # and the model class stays the wrapper (test_model_config_resolves_...)
        config = ModelConfig(str(dirs[name]), enable_multimodal=False)
        model, _ = load_into_nan(cls, config.hf_config, dirs[name])
        built[name] = (config, model)
    return built


def test_model_config_resolves_the_wrapper_and_its_language_model(models):
    for name, arch in (("wrapped", "KimiK25ForConditionalGeneration"), ("lm", "DeepseekV3ForCausalLM")):
        config, _ = models[name]
        assert config.hf_config.architectures == [arch]
        assert config.attention_arch == AttentionArch.MLA and config.kv_lora_rank == 512
        assert config.num_hidden_layers == 8 and config.hf_text_config.model_type == "deepseek_v3"
        assert not config.is_multimodal


def test_every_parameter_is_loaded_from_the_tiny_checkpoints(models):
    for name in ("wrapped", "lm"):
        _, model = models[name]
        for pname, p in model.named_parameters():
            assert not torch.isnan(p.float()).any(), f"{name}: {pname} left unset by load_weights"
    (_, wrapped), (_, lm) = models["wrapped"], models["lm"]
    lm_params = dict(lm.named_parameters())
    for pname, p in wrapped.language_model.named_parameters():
        assert torch.equal(p, lm_params[pname]), pname  # the same language model, tensor for tensor


def test_capture_ids_through_the_wrapper_reach_the_language_models_layers(models, dirs):
    """eyas resolves the taps from `text_config` and converts them with the language model's type;
    the wrapper passes the ids on and the DeepSeek model applies its +1-iff-ids[0]==1 rule."""
    config = read_config(dirs["wrapped"])
    taps = resolve_aux_layer_ids(config, None)
    ids = sglang_layer_ids(text_model_type(config), taps)
    assert (taps, ids) == ([1, 3, 4], [1, 3, 4])
    (_, wrapped), (_, lm) = models["wrapped"], models["lm"]
    wrapped.set_eagle3_layers_to_capture(ids)
    lm.set_eagle3_layers_to_capture(ids)
    captured = sglang_captured_inputs("deepseek_v3", ids)  # HF hidden_states indices: taps + 1
    assert list(wrapped.language_model.model.layers_to_capture) == captured == [t + 1 for t in taps]
    assert list(lm.model.layers_to_capture) == captured
    assert wrapped.language_model.capture_aux_hidden_states and lm.capture_aux_hidden_states
    lm.set_eagle3_layers_to_capture([2, 3, 4])  # ids[0] != 1: taken as hidden_states indices
    assert list(lm.model.layers_to_capture) == [2, 3, 4]


def test_wrapper_forward_hands_text_embeddings_to_the_language_model(models, monkeypatch):
    """KimiK25ForConditionalGeneration.forward -> general_mm_embed_routine: with no multimodal input in
    the batch (text-only, any chunk of a chunked prefill) the language model gets input_embeds =
    embed_tokens(input_ids) and its output is returned as it is."""
    _, wrapped = models["wrapped"]
    seen = {}
    sentinel = object()

    def language_model_forward(input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        seen.update(input_ids=input_ids, positions=positions, input_embeds=input_embeds)
        return sentinel

    monkeypatch.setattr(wrapped.language_model, "forward", language_model_forward)
    batch = extend_batch(["a", "b"], prefix_lens=[0, 5], extend_lens=[4, 3], vocab_size=tiny_kimi.VOCAB)
    out = wrapped(batch.input_ids, batch.positions, batch)
    assert out is sentinel
    embed = wrapped.language_model.model.embed_tokens.weight
    assert torch.equal(seen["input_embeds"], embed[batch.input_ids])  # [T, H]
    assert seen["input_ids"] is None and torch.equal(seen["positions"], batch.positions)
