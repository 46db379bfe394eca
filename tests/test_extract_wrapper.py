"""The HF extract backend on a multimodal wrapper (issue 28): tools/tiny_kimi.py's Kimi-K2.5 dir loads as
transformers' image-text-to-text class, its taps are hooked on the language model's decoder, and the
store it writes equals, row for row, the store of the bare DeepSeek-V3 language model and transformers'
own forward of the wrapper."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tiny_kimi  # tools/ is on sys.path (pyproject pythonpath)
import torch
from modelkit import token_shard_attrs

from eyas.core.layer_ids import resolve_aux_layer_ids
from eyas.extract.hf_backend import extract_shard
from eyas.model.capture import base_decoder
from eyas.model.target import is_multimodal_wrapper, load_target, read_config
from eyas.store import HiddenStore, write_token_shard

PROMPTS = ["Hi", "What is the capital of France?", "Write a haiku about rain, then explain it."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> dict:
    return tiny_kimi.write_family(tmp_path_factory.mktemp("kimi_extract"))


@pytest.fixture(scope="module")
def token_shard(tmp_path_factory, tokenizer):
    samples = []
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=True, return_dict=False
        )
        ids = np.asarray(ids["input_ids"] if isinstance(ids, dict) else ids, dtype=np.int32)
        samples.append((ids, np.ones(len(ids), np.uint8)))
    path = tmp_path_factory.mktemp("kimi_tokens") / "shard-00000.zarr"
    attrs = token_shard_attrs(tokenizer, model_id="tiny-kimi")
    write_token_shard(path, samples, [f"s{i}" for i in range(len(samples))], attrs)
    return path, samples


def test_the_wrapper_is_recognised_and_its_decoder_is_the_language_models(family):
    wrapped = read_config(family["wrapped"])
    assert is_multimodal_wrapper(wrapped) and not is_multimodal_wrapper(read_config(family["lm"]))
    model = load_target(family["wrapped"])
    decoder = base_decoder(model)
    assert type(decoder).__name__ == "DeepseekV3Model"
    assert len(decoder.layers) == wrapped["text_config"]["num_hidden_layers"]


def test_a_wrapper_whose_config_maps_its_remote_code_loads_natively(family, tmp_path):
    # moonshotai/Kimi-K2.5's config.json maps AutoConfig, AutoModel and AutoModelForCausalLM to its own
    # modeling_kimi_k25.py / configuration_kimi_k25.py: untrusted, transformers' own class must run
    auto_map = {
        "AutoConfig": "configuration_kimi_k25.KimiK25Config",
        "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
        "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
    }
    shutil.copytree(family["wrapped"], tmp_path / "kimi")
    config = read_config(tmp_path / "kimi") | {"auto_map": auto_map}
    (tmp_path / "kimi" / "config.json").write_text(json.dumps(config))
    decoder = base_decoder(load_target(tmp_path / "kimi"))
    assert type(decoder).__name__ == "DeepseekV3Model"
    assert base_decoder(load_target(family["lm"])).layers[0].mlp.__class__.__name__ == "DeepseekV3MLP"


def test_wrapper_store_equals_the_language_models_and_transformers_forward(family, token_shard, tmp_path):
    shard, samples = token_shard
    layer_ids = resolve_aux_layer_ids(read_config(family["wrapped"]), None)  # from text_config
    assert layer_ids == resolve_aux_layer_ids(read_config(family["lm"]), None) == [1, 3, 4]
    stores = {}
    for name in ("wrapped", "lm"):
        out = tmp_path / f"{name}.zarr"
        extract_shard(
            str(shard), str(out), str(family[name]), layer_ids=layer_ids, model_id=name, progress=False
        )
        stores[name] = HiddenStore(out)
    assert stores["wrapped"].attrs["model_architecture"] == "KimiK25ForConditionalGeneration"
    assert stores["wrapped"].attrs["text_model_type"] == "deepseek_v3"

    model = load_target(family["wrapped"])  # transformers' own wrapper forward, fp32, a sample at a time
    for s, (ids, _) in enumerate(samples):
        aux, final = stores["wrapped"].sample(s)
        bare_aux, bare_final = stores["lm"].sample(s)
        assert torch.equal(aux, bare_aux) and torch.equal(final, bare_final), s
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids.astype(np.int64))[None], output_hidden_states=True)
        want = torch.cat([out.hidden_states[v + 1][0] for v in layer_ids], dim=-1)  # [T, 3H]
        # within bf16 rounding (one bf16 step): the store's samples ran batched and padded, this alone
        torch.testing.assert_close(aux.float(), want, rtol=2**-7, atol=2**-7)
        logits = model.lm_head(final.float())  # [T, V]: the final state is the one the head reads
        assert torch.allclose(logits, out.logits[0], atol=0.05), s
