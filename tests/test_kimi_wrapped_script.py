"""bench/gpu/kimi_wrapped.py's CPU parts on CPU, so the GPU run can fail only on GPU things (the SGLang
capture and the EAGLE-3 engine): the tiny models, the data, the HF reference stores, the per-tap
comparison, the stores' provenance, the refusal of another model's stores, and training + export of the
MLA drafter that `train.drafter: auto` picks for the MLA target."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eyas.export import expected_tensors, load_export
from eyas.model.drafter import Eagle3Drafter

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "kimi_wrapped.py"
spec = importlib.util.spec_from_file_location("kimi_wrapped", SCRIPT)
kimi_wrapped = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kimi_wrapped)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("kimi_wrapped")
    torch.set_num_threads(2)
    models = kimi_wrapped.make_models(out / "models")
    data = kimi_wrapped.make_data(out, models["wrapped"], samples=8)
    stores = {}
    for name, dtype in (("hf-fp32", "float32"), ("hf-bf16", "bfloat16")):
        stores[name] = str(out / f"{name}.zarr")
        kimi_wrapped.hf_store(data["shards"]["train"], models["bare"], stores[name], dtype, "cpu")
    return {"out": out, "models": models, "data": data, "stores": stores}


def test_data_and_default_taps(run):
    from eyas.store import read_token_shard

    shard = read_token_shard(run["data"]["shards"]["train"])
    assert shard.num_samples == 8 and shard.attrs["split"] == "train"
    assert (
        kimi_wrapped.taps_of(run["models"]["wrapped"])
        == kimi_wrapped.taps_of(run["models"]["bare"])
        == [1, 3, 4]
    )


def test_tap_differences_per_tap(run):
    fp32, bf16 = run["stores"]["hf-fp32"], run["stores"]["hf-bf16"]
    same = kimi_wrapped.tap_differences(fp32, fp32)
    assert [d["tap"] for d in same] == ["tap1", "tap3", "tap4", "final"]
    assert all(d["max_abs"] == 0 and d["rel_rms"] == 0 and d["rows"] > 0 for d in same)
    floor = kimi_wrapped.tap_differences(bf16, fp32)  # bf16 compute against fp32: rounding, not zero
    assert all(0 < d["rel_rms"] < 0.05 for d in floor), floor


def test_store_provenance_names_the_model_that_ran(run):
    prov = kimi_wrapped.store_provenance(run["stores"]["hf-fp32"])
    assert prov["model_architecture"] == "DeepseekV3ForCausalLM" and prov["text_model_type"] == "deepseek_v3"
    assert prov["layer_ids"] == [1, 3, 4] and prov["backend"] == "hf"


def test_another_models_stores_are_refused(run):
    message = kimi_wrapped.refused_with_other_hash(
        run["data"],
        {"train": run["stores"]["hf-fp32"]},
        run["models"]["bare"],
        run["models"]["wrapped"],
        run["out"],
    )
    assert "provenance field 'model_hash'" in message, message


def test_train_and_export_the_mla_drafter(run):
    out = run["out"] / "trained"
    report = kimi_wrapped.train_and_export(
        run["data"], {"train": run["stores"]["hf-fp32"]}, run["models"]["bare"], out, 3, "cpu"
    )
    assert report["train"]["steps"] == 3
    assert report["drafter"]["attention"] == "mla" and report["drafter"]["kv_lora_rank"] == 512
    config = json.loads((out / "export" / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang adds 1 itself
    drafter = Eagle3Drafter.from_pretrained(out / "drafter")
    assert set(load_file(str(out / "export" / "model.safetensors"))) == set(expected_tensors(drafter.config))
    assert load_export(out / "export", drafter.embed_tokens.weight.detach()).config == drafter.config


def test_serving_inputs_on_cpu(run):
    """All of the served step but the engines: prompts, the exports of the trained drafter and the
    untrained control (both MLA, both recognised as EAGLE-3 drafts by the draft swap), engine args."""
    from eyas.engine.sglang_draft_swap import is_eagle3_draft_dir

    out = run["out"] / "trained"
    if not (out / "export").exists():
        kimi_wrapped.train_and_export(
            run["data"], {"train": run["stores"]["hf-fp32"]}, run["models"]["bare"], out, 3, "cpu"
        )
    sets, exports, base = kimi_wrapped.serving_inputs(out, run["models"]["bare"], run["data"], "triton", 3)
    assert len(sets["heldout"]) == 2 and all(len(p) > 5 for p in sets["heldout"])  # held-out shard: 2
    assert set(exports) == {"trained", "untrained"}
    for path in exports.values():
        assert is_eagle3_draft_dir(path)
        assert json.loads((Path(path) / "config.json").read_text())["architectures"] == [
            "Eagle3DeepseekV2ForCausalLM"
        ]
    assert (
        base["enable_multimodal"] is False
        and base["skip_tokenizer_init"]
        and base["attention_backend"] == "triton"
    )


def test_sglang_capture_is_asked_with_the_engine_settings_it_takes(run, monkeypatch):
    # The GPU step hands eyas's SGLang backend typed settings (a dict failed there on `tp_size`).
    asked = {}

    def extract_shard_sglang(shard, out, model_dir, **kw):
        asked.update(kw, shard=shard, out=out)
        return {"tokens": 0}

    monkeypatch.setattr("eyas.extract.sglang_backend.extract_shard_sglang", extract_shard_sglang)
    shard, model = run["data"]["shards"]["train"], run["models"]["wrapped"]
    assert kimi_wrapped.sglang_store(shard, model, "/tmp/x.zarr", 64, "triton") == {"tokens": 0}
    settings = asked["settings"]
    assert (settings.tp_size, settings.chunked_prefill_size, settings.attention_backend) == (1, 64, "triton")
    assert settings.engine_args == {"enable_multimodal": False}
    assert asked["layer_ids"] == kimi_wrapped.taps_of(model) and asked["model_id"] == "tiny-kimi"
