"""`eyas specforge-prepare` / `import-specforge-drafter` without SpecForge installed: the files written
for SpecForge's trainer and the checkpoint conversion back. tests/specforge/ runs them against the
real SpecForge 0.2.0 (`make test-specforge`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from eyas.data.vocab import load_draft_vocab
from eyas.export import sglang_config
from eyas.interop.cli import main
from eyas.interop.specforge_export import export_specforge
from eyas.interop.specforge_train import eyas_state_dict, import_specforge_drafter
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import load_embed_and_head, read_config


@pytest.fixture(scope="module")
def dump(data, tmp_path_factory):
    """The trainer tests' stores (tiny tied target, draft vocab 64) as an export-specforge dump."""
    root = tmp_path_factory.mktemp("sf_results")
    for i, (tok, hid) in enumerate(zip(data["shards"], data["stores"], strict=True)):
        for kind, path in (("tokens", tok), ("hidden", hid)):
            (root / kind / "train").mkdir(parents=True, exist_ok=True)
            (root / kind / "train" / f"shard-{i:05d}.zarr").symlink_to(path)
    out = tmp_path_factory.mktemp("sf_dump") / "dump"
    export_specforge(root, out)
    return out


def test_prepare_writes_specforge_inputs(dump, data, tmp_path, capsys):
    out = tmp_path / "run"
    code = main([
        "specforge-prepare", str(dump), str(out), "--model", data["model"], "--vocab", data["vocab"],
        "--set", "learning_rate=1e-3", "--set", "max_steps=null", "--set", "attention_backend=sdpa",
    ])  # fmt: skip
    assert code == 0
    info = json.loads(capsys.readouterr().out)
    assert info["lm_head_key"] == "model.embed_tokens.weight"  # the tiny target ties its embeddings
    assert (info["samples"], info["draft_vocab_size"]) == (10, 64)

    run = yaml.safe_load((out / "run.yaml").read_text())
    assert run["data"]["hidden_states_path"] == str(dump.resolve())
    assert run["training"]["learning_rate"] == 1e-3 and run["training"]["max_steps"] is None
    assert run["training"]["attention_backend"] == "sdpa" and run["training"]["ttt_length"] == 7
    assert run["model"]["vocab_mapping_path"] == str(out / "vocab_mapping.pt")

    mapping = torch.load(out / "vocab_mapping.pt", weights_only=True)  # as SpecForge's load_vocab_mapping
    d2t, t2d, _ = load_draft_vocab(data["vocab"])
    assert torch.equal(mapping["d2t"], d2t) and torch.equal(mapping["t2d"], t2d)

    index = json.loads((out / "target" / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(out / "target" / "model.safetensors", "pt") as fh:
        assert sorted(index) == sorted(fh.keys())
    assert (out / "target" / "config.json").resolve() == (Path(data["model"]) / "config.json").resolve()

    config = json.loads((out / "draft_config.json").read_text())
    cfg = DrafterConfig.from_target_config(read_config(data["model"]), 64, [0, 1, 2])
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert {k: v for k, v in config.items() if k != "eyas_provenance"} == {
        k: v for k, v in sglang_config(cfg).items() if k != "eyas_provenance"
    }


def test_prepare_refuses_unknown_setting(dump, data, tmp_path):
    from eyas.interop.specforge_train import prepare_specforge_run

    with pytest.raises(ValueError, match="unknown SpecForge setting"):
        prepare_specforge_run(dump, tmp_path / "run", data["model"], data["vocab"], {"epochs": 3})


def specforge_checkpoint(path, data, strategy="eagle3") -> Eagle3Drafter:
    """A SpecForge-shaped training_state.pt (bf16 `midlayer.*` weights, no embedding) of a random
    drafter with the data's vocab; returns that drafter."""
    d2t, t2d, _ = load_draft_vocab(data["vocab"])
    torch.manual_seed(0)
    model = Eagle3Drafter(DrafterConfig.from_target_config(read_config(data["model"]), 64, [0, 1, 2]))
    model.set_vocab(d2t, t2d)
    draft = {}
    for name, t in model.state_dict().items():
        if name == "embed_tokens.weight":
            continue  # SpecForge's checkpoint_state_filter drops the frozen embedding
        name = name.replace("layers.0.", "midlayer.", 1)
        draft[name] = t if name in ("d2t", "t2d") else t.to(torch.bfloat16)
    path.mkdir(parents=True)
    torch.save({"draft_state_dict": draft, "global_step": 7, "epoch": 1, "strategy": strategy},
               path / "training_state.pt")  # fmt: skip
    return model


def test_import_checkpoint(dump, data, tmp_path, capsys):
    model = specforge_checkpoint(tmp_path / "output" / "eyas-specforge-step7", data)
    code = main([
        "import-specforge-drafter", str(tmp_path / "output"), str(tmp_path / "drafter"), "--model",
        data["model"], "--vocab", data["vocab"], "--dump", str(dump),
    ])  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 7
    back = Eagle3Drafter.from_pretrained(tmp_path / "drafter")
    for name, t in model.state_dict().items():
        want = load_embed_and_head(data["model"])[0] if name == "embed_tokens.weight" else t
        if want.is_floating_point() and name != "embed_tokens.weight":
            want = want.to(torch.bfloat16)
        assert torch.equal(back.state_dict()[name], want.to(back.state_dict()[name].dtype)), name
    meta = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert meta["model_id"] == "tiny" and meta["layer_ids"] == [0, 1, 2]
    assert meta["trained_by"]["trainer"] == "specforge==0.2.0" and meta["trained_by"]["global_step"] == 7


def test_import_refuses_other_vocab_or_strategy(dump, data, tmp_path):
    specforge_checkpoint(tmp_path / "dflash", data, strategy="dflash")
    with pytest.raises(ValueError, match="no EAGLE-3 draft_state_dict"):
        import_specforge_drafter(tmp_path / "dflash", tmp_path / "x", data["model"], data["vocab"], dump)
    specforge_checkpoint(tmp_path / "ck", data)
    state = torch.load(tmp_path / "ck" / "training_state.pt", weights_only=True)
    state["draft_state_dict"]["d2t"] = torch.zeros_like(state["draft_state_dict"]["d2t"])
    torch.save(state, tmp_path / "ck" / "training_state.pt")
    with pytest.raises(ValueError, match="d2t"):
        import_specforge_drafter(tmp_path / "ck", tmp_path / "y", data["model"], data["vocab"], dump)


def test_state_dict_names():
    renamed = eyas_state_dict({"draft_model.midlayer.mlp.up_proj.weight": 1, "fc.weight": 2, "d2t": 3})
    assert renamed == {"layers.0.mlp.up_proj.weight": 1, "fc.weight": 2, "d2t": 3}
