"""Training test data and helpers: stores made from a tiny real target's own greedy text.

`sharpen` and `build` back the session fixtures `sharp_target` and `data` (conftest.py); the rest are
the settings, inputs and worker processes the trainer tests share.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from eyas.config import TrainSettings
from eyas.core.layer_ids import LAYER_ID_CONVENTION
from eyas.core.provenance import model_hash, sha256_array
from eyas.data.vocab import build_draft_vocab, save_draft_vocab
from eyas.store import hidden_store_writer, read_token_shard, write_token_shard
from eyas.train.trainer import train

LAYERS = [0, 1, 2]


def sharpen(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny Llama with its (tied) embedding scaled up, so the teacher is peaked, not uniform."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(tiny_model_dir))
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(40.0)
    model.save_pretrained(out)
    return out


def build(sharp_target: Path, root: Path) -> dict:
    """Two (token shard, hidden store) pairs of greedy continuations + a draft vocab."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(sharp_target)).eval()
    mhash = model_hash(sharp_target)
    prov = {"model_id": "tiny", "tokenizer_hash": "tok", "chat_template_hash": "tpl"}
    rng = np.random.default_rng(0)
    shards, stores = [], []
    for shard_index in range(2):
        samples = []
        for _ in range(5):
            prompt = torch.as_tensor(rng.integers(0, 49152, 4))[None]
            with torch.no_grad():
                ids = model.generate(prompt, max_new_tokens=int(rng.integers(16, 28)), do_sample=False)[0]
            mask = np.r_[np.zeros(4), np.ones(len(ids) - 4)].astype(np.uint8)
            samples.append((ids.numpy().astype(np.int32), mask))
        tok_path = root / f"tok-{shard_index}.zarr"
        write_token_shard(tok_path, samples, [f"s{i}" for i in range(5)], prov)
        shard = read_token_shard(tok_path)
        hid_path = root / f"hid-{shard_index}.zarr"
        attrs = {
            **prov,
            "model_hash": mhash,
            "layer_ids": LAYERS,
            "layer_id_convention": LAYER_ID_CONVENTION,
            "tokens_checksum": sha256_array(shard.input_ids),
        }
        with hidden_store_writer(hid_path, shard.sample_offsets, 64, 3, attrs) as writer:
            for s in range(shard.num_samples):
                ids, _ = shard.sample(s)
                with torch.no_grad():
                    out = model(torch.as_tensor(ids, dtype=torch.long)[None], output_hidden_states=True)
                aux = torch.cat([out.hidden_states[v + 1][0] for v in LAYERS], dim=-1)
                writer.write_sample(s, bf16(aux), bf16(out.hidden_states[-1][0]))
        shards.append(str(tok_path))
        stores.append(str(hid_path))
    d2t, t2d, stats = build_draft_vocab(shards, 49152, 64)
    vocab = root / "vocab.safetensors"
    save_draft_vocab(vocab, d2t, t2d, stats, tokenizer_hash="tok")
    expected = {"model_hash": mhash, "layer_ids": LAYERS, "tokenizer_hash": "tok", "model_id": "tiny"}
    return {
        "shards": shards,
        "stores": stores,
        "vocab": str(vocab),
        "expected": expected,
        "model": str(sharp_target),
    }


def bf16(x: torch.Tensor) -> np.ndarray:
    from eyas.store import bf16_to_uint16

    return bf16_to_uint16(x)


def settings(**overrides) -> TrainSettings:
    base = dict(
        epochs=20,
        max_steps=None,
        lr=3e-3,
        warmup_steps=2,
        weight_decay=0.0,
        grad_clip=1.0,
        token_budget=64,
        ttt_steps=3,
        step_weight=0.8,
        seed=0,
        device="cpu",
        dtype="float32",
        checkpoint_every=2,
        progress=False,
        select_by_tau=False,
    )
    base.update(overrides)
    return TrainSettings(**base)


def inputs(data, out: Path, heldout: bool = False) -> dict:
    """Keyword arguments of `train` (JSON-able, also the CLI spec's `inputs`)."""
    return dict(
        token_shards=data["shards"],
        hidden_stores=data["stores"],
        vocab_path=data["vocab"],
        model_dir=data["model"],
        out_dir=str(out / "drafter"),
        log_path=str(out / "log.csv"),
        expected_provenance=data["expected"],
        heldout={"token_shards": data["shards"][1:], "hidden_stores": data["stores"][1:]}
        if heldout
        else None,
        threads=1,
    )


def run(data, out: Path, s: TrainSettings, heldout: bool = False) -> dict:
    return train(s, **inputs(data, out, heldout))


def spawn_worker(spec_path: Path, *extra: str) -> subprocess.Popen:
    """`train_worker.py` on a CLI spec in a new process (see that file for `extra`)."""
    worker = Path(__file__).with_name("train_worker.py")
    return subprocess.Popen([sys.executable, str(worker), str(spec_path), *extra], stderr=subprocess.PIPE)


def csv_rows(path: Path) -> int:
    """Data rows of a CSV file (0 if it does not exist)."""
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0
