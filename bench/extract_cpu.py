"""Small CPU bench of the HF extract stage: bare target forward vs the whole stage on the same batches.

    .venv/bin/python bench/extract_cpu.py --model-dir results/assets/model \
        --data results/assets/data/alpaca_en_demo.json --samples 20 --budget 8192 --threads 2

Tokenizes the first `--samples` alpaca-style rows with the chat template (a quick stand-in for the
tokenize stage), writes a token shard to a temp dir, then times (a) the base model alone over the
batch plan and (b) `extract_shard` (hooks, bf16 staging, writer thread, compression, disk).
Noisy on a shared machine: run both a few times and compare side by side.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eyas.extract.batching import plan_batches
from eyas.extract.hf_backend import _batch_tensors, base_decoder, extract_shard
from eyas.provenance import chat_template_hash, tokenizer_hash
from eyas.store import read_token_shard, write_token_shard
from eyas.target import default_aux_layer_ids, load_target, load_tokenizer, read_config


def make_shard(model_dir: str, data: str, samples: int, path: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    rows = json.loads(Path(data).read_text())[:samples]
    out = []
    for row in rows:
        user = row["instruction"] + (f"\n{row['input']}" if row.get("input") else "")
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        ids = np.asarray(ids["input_ids"] if isinstance(ids, dict) else ids, dtype=np.int32)
        out.append((ids, np.ones(len(ids), np.uint8)))
    attrs = {
        "split": "bench",
        "shard": 0,
        "num_shards": 1,
        "model_id": "bench",
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": chat_template_hash(tokenizer),
        "max_length": max(len(ids) for ids, _ in out),
        "eyas_version": "bench",
    }
    write_token_shard(path, out, [f"row{i}" for i in range(len(out))], attrs)


def bare_forward_seconds(model_dir: str, shard_path: Path, budget: int) -> float:
    shard = read_token_shard(shard_path)
    plan = plan_batches(np.diff(shard.sample_offsets).tolist(), budget)
    decoder = base_decoder(load_target(model_dir))
    start = time.perf_counter()
    with torch.inference_mode():
        for indices in plan.batches:
            ids, mask, _ = _batch_tensors(shard, indices, torch.device("cpu"))
            decoder(input_ids=ids, attention_mask=mask, use_cache=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layer_ids = default_aux_layer_ids(read_config(args.model_dir)["num_hidden_layers"])
    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "tokens.zarr"
        make_shard(args.model_dir, args.data, args.samples, shard)
        bare = bare_forward_seconds(args.model_dir, shard, args.budget)
        stats = extract_shard(
            str(shard),
            str(Path(tmp) / "hidden.zarr"),
            args.model_dir,
            layer_ids=layer_ids,
            model_id="bench",
            token_budget=args.budget,
            threads=args.threads,
            progress=False,
        )
    stats["bare_forward_seconds"] = bare
    stats["bare_tokens_per_s"] = stats["tokens"] / bare
    stats["stage_overhead"] = stats["seconds"] / bare - 1
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
