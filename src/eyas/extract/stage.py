"""The extract rule's entry: one token shard through the target into its hidden store, on the backend
`extract.backend` names (`hf_backend`: transformers, also on CPUs; `sglang_backend`: a stock SGLang
engine with aux capture, GPUs, configured by the `sglang` section)."""

from __future__ import annotations

import os

from eyas.config import ExtractSettings, SglangSettings
from eyas.core.diskspace import check_fits
from eyas.core.layer_ids import resolve_aux_layer_ids, text_config
from eyas.model.target import read_config, resolve_device
from eyas.store import read_token_shard
from eyas.store.size import estimated_store_bytes


def check_store_fits(
    shard: str | os.PathLike,
    out_store: str | os.PathLike,
    model_dir: str | os.PathLike,
    taps: int,
    storage: str,
    compression: str = "zstd",
) -> None:
    """Refuse, before the target loads, a store larger than the free space where it is written."""
    tokens = int(read_token_shard(shard).sample_offsets[-1])
    hidden = int(text_config(read_config(model_dir))["hidden_size"])
    need = estimated_store_bytes(tokens, hidden, taps + 1, storage, compression)
    kind = storage if compression == "zstd" else f"{storage} uncompressed"
    what = f"extract: the {kind} hidden store of {tokens:,} tokens ({taps} taps + final, hidden {hidden})"
    check_fits(out_store, need, what)


def run_extract(
    shard: str | os.PathLike,
    out_store: str | os.PathLike,
    model_dir: str | os.PathLike,
    settings: ExtractSettings,
    *,
    engine_settings: SglangSettings,
    aux_layer_ids: list[int] | None,
    model_id: str,
    trust_remote_code: bool,
    threads: int,
) -> dict:
    """Write the hidden store of `shard` at `out_store` (atomically); returns the backend's run stats.
    `engine_settings`: the `sglang` section (used by `backend: sglang`); `aux_layer_ids`:
    `model.aux_layer_ids` (None: the default taps of the target's layer count). A store that will not
    fit on its disk is refused first (`DiskSpaceError`)."""
    layer_ids = resolve_aux_layer_ids(read_config(model_dir), aux_layer_ids)
    check_store_fits(shard, out_store, model_dir, len(layer_ids), settings.storage, settings.compression)
    common = dict(
        layer_ids=layer_ids,
        dtype=settings.dtype,
        storage=settings.storage,
        chunk_tokens=settings.chunk_tokens,
        chunks_per_shard=settings.chunks_per_shard,
        compression=settings.compression,
        writer_threads=settings.writer_threads,
        writer_process=settings.writer_process,
        model_id=model_id,
        trust_remote_code=trust_remote_code,
        threads=threads,
    )
    if settings.backend == "sglang":
        from eyas.extract.sglang_backend import extract_shard_sglang

        return extract_shard_sglang(
            str(shard), str(out_store), str(model_dir), settings=engine_settings, **common
        )
    from eyas.extract.hf_backend import extract_shard

    return extract_shard(
        str(shard),
        str(out_store),
        str(model_dir),
        device=resolve_device(settings.device),
        token_budget=settings.token_budget,
        **common,
    )
