"""Run SpecForge's own EAGLE-3 trainer (PyPI `specforge==0.2.0`) on eyas stores, and bring the drafter
it trains back as an eyas drafter dir, so that eyas's evaluation (a baseline of `evaluate.baselines`)
measures it beside eyas's own.

`prepare_specforge_run` writes, next to an `eyas export-specforge` dump, everything SpecForge's
`specforge train --config run.yaml` needs for offline training (no SGLang, no dataset file):
  - `draft_config.json`: the `LlamaForCausalLMEagle3` config eyas exports for SGLang (one Llama layer
    shaped like the target; `draft_vocab_size` = eyas's draft vocab). SpecForge reads it through
    `specforge/training/model_loading.py` (`load_draft_config_source`), which only needs the one
    registered architecture name.
  - `vocab_mapping.pt`: eyas's `d2t`/`t2d` as the `torch.save` dict that
    `specforge/modeling/draft/base.py` (`Eagle3DraftModel.load_vocab_mapping`) reads. Both projects use
    the same convention (target id = draft id + d2t[draft id]; t2d[target id] marks the draft vocab), so
    only the container changes. Without it SpecForge would derive its own mapping from the dump's
    masked tokens (`specforge/training/assembly.py`, `_ensure_offline_vocab_mapping`).
  - `target/`: the target dir seen by SpecForge's frozen head. `specforge/modeling/target/target_head.py`
    (`TargetHead.load_weights`) refuses a dir without a `*.index.json` and reads `weight_map[lm_head_key]`;
    a single-file target (SmolLM2) has none, and a tied one has no `lm_head.weight`. So: symlinks to the
    target's files plus a `model.safetensors.index.json` listing every tensor, and `model.lm_head_key`
    set to `model.embed_tokens.weight` when the target ties its embeddings.
  - `run.yaml`: the typed run config (`specforge/config/schema.py`), offline (`data.hidden_states_path`),
    one process (`deployment.mode: local_colocated`), no tracker.

`import_specforge_drafter` reads SpecForge's checkpoint (`{output_dir}/{run_id}-step{N}/training_state.pt`,
`specforge/training/checkpoint.py`; its `draft_state_dict` holds the draft's weights without the frozen
embedding, `specforge/training/strategies/base.py` `checkpoint_state_filter`), renames SpecForge's
`midlayer.*` to eyas's (= SGLang's) `layers.0.*`, adds the target embedding, checks that `d2t`/`t2d`
are eyas's vocab exactly, and writes an `eyas.drafter/1` dir with the provenance of the dump's stores.
The two architectures compute the same function (tests/specforge/ checks the logits on CPU).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from eyas.core.atomic import atomic_path
from eyas.core.layer_ids import text_model_type
from eyas.core.provenance import DRAFTER_PROVENANCE, sha256_file
from eyas.data.vocab import load_draft_vocab
from eyas.export import sglang_config
from eyas.interop.specforge_export import MANIFEST
from eyas.model.drafter import DrafterConfig, Eagle3Drafter
from eyas.model.target import load_embed_and_head, read_config

SPECFORGE_VERSION = "0.2.0"
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
STATE_FILE = "training_state.pt"  # specforge/training/checkpoint.py STATE_FILE
RUN_ID = "eyas-specforge"
TARGET_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")  # fmt: skip

# SpecForge defaults (specforge/config/schema.py TrainingConfig), except where eyas's recipe is matched.
DEFAULT_SETTINGS = {
    "num_epochs": 1,
    "max_steps": None,
    "batch_size": 1,
    "learning_rate": 1e-4,
    "warmup_ratio": 0.015,
    "max_grad_norm": 0.5,
    "lr_scheduler": "cosine",
    "ttt_length": 7,
    "max_length": 2048,
    "attention_backend": "flex_attention",
    "fsdp_sharding": "SHARD_GRAD_OP",  # FSDP needs an accelerator: NO_SHARD (DDP) runs on a CPU
    "seed": 42,
    "log_interval": 50,
    "dataloader_num_workers": None,  # None: SpecForge's EAGLE-3 default (4)
}


def read_manifest(dump_dir: str | os.PathLike) -> dict:
    """The `eyas-export.json` that `eyas export-specforge` wrote beside the samples."""
    path = Path(dump_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: make the dump with `eyas export-specforge`")
    return json.loads(path.read_text())


def write_vocab_mapping(vocab_path: str | os.PathLike, out_path: str | os.PathLike) -> dict:
    """eyas's draft vocab (safetensors) as SpecForge's vocab mapping file ({"d2t", "t2d"}, torch.save)."""
    d2t, t2d, meta = load_draft_vocab(vocab_path)
    with atomic_path(out_path) as tmp:
        torch.save({"d2t": d2t, "t2d": t2d}, tmp)
    return {"draft_vocab_size": len(d2t), "vocab_size": len(t2d), "tokenizer_hash": meta["tokenizer_hash"]}


def write_target_dir(model_dir: str | os.PathLike, out_dir: str | os.PathLike) -> str:
    """A dir SpecForge's `TargetHead` can read (symlinks to the target's files plus an index); returns the
    key of the target's lm_head in it (`model.embed_tokens.weight` for a tied target)."""
    model_dir, out_dir = Path(model_dir).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = model_dir / "model.safetensors.index.json"
    names = [index.name] if index.exists() else []
    names += [p.name for p in sorted(model_dir.glob("*.safetensors"))]
    names += [n for n in TARGET_FILES if (model_dir / n).exists()]
    for name in names:
        link = out_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(model_dir / name)
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        with safe_open(model_dir / "model.safetensors", "pt") as fh:
            weight_map = {key: "model.safetensors" for key in fh.keys()}  # noqa: SIM118
        with atomic_path(out_dir / "model.safetensors.index.json") as tmp:
            Path(tmp).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    if "lm_head.weight" in weight_map:
        return "lm_head.weight"
    if not read_config(model_dir).get("tie_word_embeddings", False):
        raise ValueError(f"{model_dir}: no lm_head.weight and tie_word_embeddings is not set")
    return "model.embed_tokens.weight"


def draft_config(model_dir: str | os.PathLike, draft_vocab_size: int, layer_ids: list[int]) -> dict:
    """The draft's `config.json`: eyas's SGLang `LlamaForCausalLMEagle3` config for this target."""
    target = read_config(model_dir)
    cfg = DrafterConfig.from_target_config(target, draft_vocab_size, layer_ids)
    return sglang_config(cfg, {"layer_ids": list(layer_ids)}, text_model_type(target))


def run_config(
    dump_dir: str, target_dir: str, draft_config_path: str, vocab_mapping_path: str, lm_head_key: str,
    output_dir: str, cache_dir: str, settings: dict,
) -> dict:  # fmt: skip
    """SpecForge 0.2.0's typed run config (specforge/config/schema.py `Config`) for offline EAGLE-3."""
    s = {**DEFAULT_SETTINGS, **settings}
    unknown = sorted(set(s) - set(DEFAULT_SETTINGS))
    if unknown:
        raise ValueError(f"unknown SpecForge setting(s) {unknown}; known: {sorted(DEFAULT_SETTINGS)}")
    return {
        "run_id": RUN_ID,
        "output_dir": output_dir,
        "model": {
            "target_model_path": target_dir,
            "draft_model_config": draft_config_path,
            "lm_head_key": lm_head_key,
            "embedding_key": "model.embed_tokens.weight",
            "vocab_mapping_path": vocab_mapping_path,
            "load_target_embedding": True,
            "torch_dtype": "bfloat16",
        },
        "data": {
            "hidden_states_path": dump_dir,
            "max_length": s["max_length"],
            "dataloader_num_workers": s["dataloader_num_workers"],
            "cache_dir": cache_dir,
        },
        "training": {
            "strategy": "eagle3",
            "num_epochs": s["num_epochs"],
            "max_steps": s["max_steps"],
            "batch_size": s["batch_size"],
            "learning_rate": s["learning_rate"],
            "warmup_ratio": s["warmup_ratio"],
            "max_grad_norm": s["max_grad_norm"],
            "lr_scheduler": s["lr_scheduler"],
            "ttt_length": s["ttt_length"],
            "attention_backend": s["attention_backend"],
            "fsdp_sharding": s["fsdp_sharding"],
            "seed": s["seed"],
            "log_interval": s["log_interval"],
            "save_interval": 0,  # one checkpoint, at the end (specforge/training/trainer.py `fit`)
        },
        "tracking": {"report_to": "none"},
        "deployment": {"mode": "local_colocated"},
    }


def prepare_specforge_run(
    dump_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    vocab_path: str | os.PathLike,
    settings: dict | None = None,
) -> dict:
    """Write draft_config.json, vocab_mapping.pt, target/ and run.yaml under `out_dir` for training on the
    dump at `dump_dir`; returns {paths, run config}. The run writes its checkpoints to `out_dir/output`."""
    import yaml

    manifest = read_manifest(dump_dir)
    provenance = manifest["provenance"]
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab_mapping(vocab_path, out / "vocab_mapping.pt")
    if vocab["tokenizer_hash"] != provenance.get("tokenizer_hash"):
        raise ValueError(
            f"{vocab_path}: tokenizer_hash {vocab['tokenizer_hash']} is not the dump's "
            f"{provenance.get('tokenizer_hash')} ({Path(dump_dir) / MANIFEST})"
        )
    lm_head_key = write_target_dir(model_dir, out / "target")
    config = draft_config(model_dir, vocab["draft_vocab_size"], provenance["layer_ids"])
    if config["hidden_size"] != provenance["hidden_size"]:
        raise ValueError(
            f"target: hidden_size {config['hidden_size']}, the dump: {provenance['hidden_size']}"
        )
    with atomic_path(out / "draft_config.json") as tmp:
        Path(tmp).write_text(json.dumps(config, indent=2) + "\n")
    run = run_config(
        os.fspath(Path(dump_dir).resolve()), os.fspath(out / "target"), os.fspath(out / "draft_config.json"),
        os.fspath(out / "vocab_mapping.pt"), lm_head_key, os.fspath(out / "output"), os.fspath(out / "cache"),
        settings or {},
    )  # fmt: skip
    with atomic_path(out / "run.yaml") as tmp:
        Path(tmp).write_text(yaml.safe_dump(run, sort_keys=False))
    return {
        "run_yaml": os.fspath(out / "run.yaml"),
        "output_dir": run["output_dir"],
        "lm_head_key": lm_head_key,
        "draft_vocab_size": vocab["draft_vocab_size"],
        "samples": manifest["count"],
        "tokens": manifest["tokens"],
        "loss_mask": manifest["loss_mask"],
        "run": run,
    }


def find_training_state(path: str | os.PathLike) -> Path:
    """`training_state.pt` of a file, a `{run_id}-step{N}` dir, or a run's output dir (its highest step)."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / STATE_FILE).is_file():
        return path / STATE_FILE
    steps = []
    for step_dir in path.glob("*-step*"):
        tail = step_dir.name.rsplit("-step", 1)[-1]
        if tail.isdigit() and (step_dir / STATE_FILE).is_file():
            steps.append((int(tail), step_dir / STATE_FILE))
    if not steps:
        raise FileNotFoundError(f"{path}: no {STATE_FILE} (nor *-step*/{STATE_FILE})")
    return max(steps)[1]


def eyas_state_dict(draft_state: dict) -> dict[str, torch.Tensor]:
    """SpecForge draft names -> eyas's (SGLang's): `midlayer.` -> `layers.0.`; a `draft_model.` prefix
    (an unfiltered state dict) is dropped."""
    out = {}
    for key, tensor in draft_state.items():
        name = key.removeprefix("draft_model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name.removeprefix("midlayer.")
        out[name] = tensor
    return out


def import_specforge_drafter(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    vocab_path: str | os.PathLike,
    dump_dir: str | os.PathLike,
) -> dict:
    """Write SpecForge's trained draft as an `eyas.drafter/1` dir at `out_dir`; returns a summary."""
    state_path = find_training_state(checkpoint)
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    if state.get("strategy") != "eagle3" or "draft_state_dict" not in state:
        raise ValueError(f"{state_path}: no EAGLE-3 draft_state_dict (strategy {state.get('strategy')!r})")
    provenance = read_manifest(dump_dir)["provenance"]
    d2t, t2d, _ = load_draft_vocab(vocab_path)
    tensors = eyas_state_dict(state["draft_state_dict"])
    for name, want in (("d2t", d2t), ("t2d", t2d)):
        if name not in tensors or not torch.equal(tensors[name].to(want.dtype), want):
            raise ValueError(f"{state_path}: the draft's {name} is not {vocab_path}'s (mapping not loaded?)")
    cfg = DrafterConfig.from_target_config(read_config(model_dir), len(d2t), provenance["layer_ids"])
    model = Eagle3Drafter(cfg)
    embed, _ = load_embed_and_head(model_dir)
    tensors["embed_tokens.weight"] = embed.float()
    result = model.load_state_dict(tensors, strict=False)  # copies into the fp32 parameters
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{state_path}: missing keys {result.missing_keys}, unexpected keys {result.unexpected_keys}"
        )
    extra = {field: provenance[field] for field in DRAFTER_PROVENANCE}
    extra["draft_vocab_hash"] = sha256_file(vocab_path)
    extra["trained_by"] = {
        "trainer": f"specforge=={SPECFORGE_VERSION}",
        "checkpoint": os.fspath(Path(state_path).resolve()),
        "global_step": state.get("global_step"),
        "epoch": state.get("epoch"),
        "dump": os.fspath(Path(dump_dir).resolve()),
    }
    model.save_pretrained(out_dir, extra_config=extra)
    return {
        "out_dir": os.fspath(out_dir),
        "checkpoint": os.fspath(state_path),
        "global_step": state.get("global_step"),
        "tensors": len(tensors),
        "dtypes": sorted({str(t.dtype) for t in state["draft_state_dict"].values()}),
    }
