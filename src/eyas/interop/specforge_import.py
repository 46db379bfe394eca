"""Convert a SpecForge offline dump (one `torch.save` file per sample) into eyas stores, streaming.

SpecForge's `prepare_hidden_states` writes `rows_{a}-{b}/data_{i}.ckpt`, each a dict of
`input_ids` [T] and `loss_mask` [T] (int64), `hidden_state` [1, T', H] (the target's post-norm last
state) and `aux_hidden_state` [1, T', K*H] (SGLang's capture at the input of layers v+1, i.e. our
drafter-convention ids v), bf16, with T' >= T when rows were padded to a batch's longest. Its
default taps are ours: [1, L//2-1, L-4].

Files are opened with `torch.load(mmap=True, weights_only=True)`: no pickle code runs, and only the
pages a sample's tensors occupy are read, so a terabyte dump converts in constant memory. A file that
cannot be read or disagrees with the others is quarantined in `rejects.jsonl` with its path and
reason; `stats.json` has read == kept + rejected.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from eyas.core.atomic import atomic_file
from eyas.core.layer_ids import LAYER_ID_CONVENTION, resolve_aux_layer_ids, text_config
from eyas.core.provenance import (
    EYAS_VERSION,
    FINAL_NORM,
    chat_template_hash,
    model_hash,
    sha256_array,
    tokenizer_hash,
)
from eyas.model.target import load_tokenizer, read_config
from eyas.store import CHUNK_TOKENS, hidden_store_writer, shard_name, write_token_shard

FILE_PATTERN = re.compile(r"data_(\d+)\.ckpt$")
KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")


@dataclass(frozen=True, eq=False)
class DumpSample:
    path: Path
    index: int  # SpecForge's row index (the number in data_{i}.ckpt)
    length: int  # real tokens T
    padding: int  # rows beyond T in the state tensors (padded to a batch's longest): dropped
    input_ids: np.ndarray  # [T] int32, kept from pass 1 (5 bytes/token: 87 MB for 17.3M tokens)
    loss_mask: np.ndarray  # [T] uint8


def find_dump_files(dump_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """All `data_{i}.ckpt` under `dump_dir`, ordered by i."""
    found = []
    for path in Path(dump_dir).rglob("data_*.ckpt"):
        match = FILE_PATTERN.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", mmap=True, weights_only=True)


def inspect_sample(path: Path, hidden: int, aux_width: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(real length T, padding rows, input_ids int32, loss_mask uint8); raises ValueError naming the
    field that is wrong."""
    data = _load(path)
    if not isinstance(data, dict):
        raise ValueError(f"not a dict but {type(data).__name__}")
    missing = [key for key in KEYS if key not in data]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    ids, mask = data["input_ids"].reshape(-1), data["loss_mask"].reshape(-1)
    length = len(ids)
    if len(mask) != length:
        raise ValueError(f"loss_mask has {len(mask)} entries, input_ids {length}")
    for key, width in (("hidden_state", hidden), ("aux_hidden_state", aux_width)):
        tensor = data[key]
        if tensor.dim() != 3 or tensor.shape[0] != 1 or tensor.shape[2] != width or tensor.shape[1] < length:
            raise ValueError(f"{key} has shape {list(tensor.shape)}, expected [1, >={length}, {width}]")
        if tensor.dtype != torch.bfloat16:
            raise ValueError(f"{key} is {tensor.dtype}, expected torch.bfloat16")
    if data["hidden_state"].shape[1] != data["aux_hidden_state"].shape[1]:
        raise ValueError("hidden_state and aux_hidden_state have different row counts")
    padding = int(data["hidden_state"].shape[1]) - length
    return length, padding, ids.numpy().astype(np.int32), (mask.numpy() != 0).astype(np.uint8)


def _write_shard(
    out_dir: Path,
    split: str,
    shard: int,
    num_shards: int,
    samples: list[DumpSample],
    token_attrs: dict,
    hidden_attrs: dict,
    hidden: int,
    num_taps: int,
    chunk_tokens: int,
) -> None:
    name = shard_name(shard)
    token_samples = [(sample.input_ids, sample.loss_mask) for sample in samples]
    sample_ids = [f"specforge:{s.index}" for s in samples]
    attrs = {**token_attrs, "shard": shard, "num_shards": num_shards}
    write_token_shard(out_dir / "tokens" / split / name, token_samples, sample_ids, attrs)
    lengths = [s.length for s in samples]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.concatenate([t for t, _ in token_samples]) if token_samples else np.zeros(0, np.int32)
    attrs = {**hidden_attrs, "split": split, "shard": shard, "tokens_checksum": sha256_array(ids)}
    path = out_dir / "hidden" / split / name
    with hidden_store_writer(path, offsets, hidden, num_taps, attrs, chunk_tokens) as store:
        for index, sample in enumerate(samples):  # one sample's states in memory at a time
            data = _load(sample.path)
            aux = data["aux_hidden_state"][0, : sample.length]  # [T, K*H] bf16
            final = data["hidden_state"][0, : sample.length]  # [T, H] bf16
            store.write_sample(index, aux.view(torch.uint16).numpy(), final.view(torch.uint16).numpy())


def import_specforge(
    dump_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    model_dir: str | os.PathLike,
    *,
    split: str = "train",
    samples_per_shard: int = 4096,
    layer_ids: list[int] | None = None,
    model_id: str | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
) -> dict:
    """Write `out_dir/tokens/{split}/shard-*.zarr` and `out_dir/hidden/{split}/shard-*.zarr` (the
    results/ layout), `out_dir/import/{split}/rejects.jsonl` and `stats.json`; returns the stats."""
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be >= 1, got {samples_per_shard}")
    config = read_config(model_dir)
    hidden = int(text_config(config)["hidden_size"])
    layer_ids = resolve_aux_layer_ids(config, layer_ids)
    model_id = model_id or os.fspath(model_dir)
    token_attrs = _token_attrs(load_tokenizer(model_dir), split, model_id, dump_dir)
    files = find_dump_files(dump_dir)
    if not files:
        raise FileNotFoundError(f"{dump_dir}: no SpecForge data_*.ckpt files")

    kept, rejects = _inspect_all(files, hidden, len(layer_ids) * hidden)  # pass 1
    hidden_attrs = _hidden_attrs(model_id, model_dir, layer_ids, token_attrs)
    out_dir = Path(out_dir)
    shards = [kept[i : i + samples_per_shard] for i in range(0, len(kept), samples_per_shard)] or [[]]
    for shard, samples in enumerate(shards):  # pass 2
        _write_shard(
            out_dir, split, shard, len(shards), samples, token_attrs, hidden_attrs, hidden, len(layer_ids),
            chunk_tokens,
        )  # fmt: skip

    stats = {
        "read": len(files),
        "kept": len(kept),
        "rejected": len(rejects),
        "shards": len(shards),
        "tokens": int(sum(s.length for s in kept)),
        "padding_rows_dropped": int(sum(s.padding for s in kept)),
    }
    _write_report(out_dir / "import" / split, rejects, stats)
    return stats


def _token_attrs(tokenizer, split: str, model_id: str, dump_dir: str | os.PathLike) -> dict:
    """The provenance attrs of the token shards (an imported shard has no max_length)."""
    return {
        "split": split,
        "model_id": model_id,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": chat_template_hash(tokenizer),
        "max_length": None,
        "eyas_version": EYAS_VERSION,
        "imported_from": f"specforge:{os.fspath(dump_dir)}",
    }


def _inspect_all(
    files: list[tuple[int, Path]], hidden: int, aux_width: int
) -> tuple[list[DumpSample], list[dict]]:
    """Pass 1 over the dump: (the samples kept, with their ids and masks; the rejects, one row per
    file that cannot be read or disagrees). mmap reads no state pages."""
    kept: list[DumpSample] = []
    rejects: list[dict] = []
    for index, path in files:
        try:
            length, padding, ids, mask = inspect_sample(path, hidden, aux_width)
        except Exception as err:  # any unreadable or inconsistent file is quarantined, never fatal
            rejects.append({"source": os.fspath(path), "reason": "bad_sample", "detail": str(err)[:500]})
            continue
        kept.append(DumpSample(path, index, length, padding, ids, mask))
    return kept, rejects


def _hidden_attrs(
    model_id: str, model_dir: str | os.PathLike, layer_ids: list[int], token_attrs: dict
) -> dict:
    """The provenance attrs of the hidden stores: the target's, with compute dtype and device unknown
    (SpecForge's dump does not record them)."""
    return {
        "model_id": model_id,
        "model_hash": model_hash(model_dir),
        "layer_ids": layer_ids,
        "layer_id_convention": LAYER_ID_CONVENTION,
        "final_norm": FINAL_NORM,
        "compute_dtype": "unknown",
        "device": "unknown",
        "backend": "specforge-import",
        "imported_from": token_attrs["imported_from"],
        "tokenizer_hash": token_attrs["tokenizer_hash"],
        "chat_template_hash": token_attrs["chat_template_hash"],
        "eyas_version": EYAS_VERSION,
    }


def _write_report(report: Path, rejects: list[dict], stats: dict) -> None:
    """`rejects.jsonl` and `stats.json` in `report` (each atomic)."""
    report.mkdir(parents=True, exist_ok=True)
    with atomic_file(report / "rejects.jsonl") as fh:
        for row in rejects:
            fh.write(json.dumps(row) + "\n")
    with atomic_file(report / "stats.json") as fh:
        json.dump(stats, fh, indent=1)
