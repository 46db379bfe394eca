"""An extraction job, whatever the backend: the checks every backend runs first, the provenance a
hidden store records, and the job's resource figures."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import numpy as np
import torch

from eyas.core.layer_ids import LAYER_ID_CONVENTION, text_config, validate_layer_ids
from eyas.core.provenance import EYAS_VERSION, FINAL_NORM, model_hash, sha256_array
from eyas.model.target import read_config
from eyas.store import COPIED_SHARD_ATTRS, ProvenanceError, TokenShard, read_token_shard


def check_shard(shard: TokenShard, path: str, vocab_size: int) -> None:
    offsets = shard.sample_offsets
    if (
        len(offsets) == 0
        or offsets[0] != 0
        or offsets[-1] != len(shard.input_ids)
        or np.any(np.diff(offsets) < 0)
    ):
        raise ValueError(
            f"{path}: sample_offsets must rise from 0 to len(input_ids)={len(shard.input_ids)}, "
            f"got {offsets[:3].tolist()}...{offsets[-3:].tolist()}"
        )
    for field in COPIED_SHARD_ATTRS:
        if field not in shard.attrs:
            raise ProvenanceError(f"{path}: token shard attrs lack provenance field {field!r}")
    bad = np.flatnonzero((shard.input_ids < 0) | (shard.input_ids >= vocab_size))
    if len(bad):
        sample = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        raise ValueError(
            f"{path}: input_ids[{bad[0]}] (sample {sample}) = {shard.input_ids[bad[0]]} is outside the "
            f"target vocab [0, {vocab_size})"
        )


def open_job(token_shard: str, model_dir: str | os.PathLike, layer_ids: list[int]):
    """What every backend checks first: (model config, num_layers, hidden, validated layer_ids, shard)."""
    config = read_config(model_dir)
    text = text_config(config)
    num_layers, hidden = int(text["num_hidden_layers"]), int(text["hidden_size"])
    layer_ids = validate_layer_ids(layer_ids, num_layers)
    shard = read_token_shard(token_shard)
    check_shard(shard, token_shard, int(text["vocab_size"]))
    return config, num_layers, hidden, layer_ids, shard


def store_attrs(
    shard: TokenShard,
    token_shard: str | os.PathLike,
    model_id: str,
    model_dir: str | os.PathLike,
    layer_ids: list[int],
    *,
    backend: str,
    compute_dtype: torch.dtype,
    device: torch.device,
) -> dict:
    """Provenance of a hidden store (docs/design.md); the store writer adds format, sizes, dtype, codec."""
    return {
        "model_id": model_id,
        "model_hash": model_hash(model_dir),
        "layer_ids": list(layer_ids),
        "layer_id_convention": LAYER_ID_CONVENTION,
        "final_norm": FINAL_NORM,
        "compute_dtype": str(compute_dtype).removeprefix("torch."),
        "device": str(device),
        "backend": backend,
        **{field: shard.attrs[field] for field in COPIED_SHARD_ATTRS},
        "tokens_checksum": sha256_array(shard.input_ids),
        "token_shard": os.fspath(token_shard),
        "eyas_version": EYAS_VERSION,
    }


def stored_bytes(store: str | os.PathLike) -> int:
    """Bytes of the hidden-state arrays on disk (scales included, metadata not)."""
    store = Path(store)
    return sum(
        f.stat().st_size
        for name in ("aux", "final", "scale")
        if (store / name).exists()
        for f in (store / name).rglob("*")
        if f.is_file()
    )


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def default_writer_threads(threads: int | None) -> int:
    """Leave one core to the thread that drives the model; the rest compress and write."""
    return max(1, (threads or os.cpu_count() or 2) - 1)
