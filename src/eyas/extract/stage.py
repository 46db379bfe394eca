"""The extract rule's entry: one token shard through the target into its hidden store, on the backend
`extract.backend` names (`hf_backend`: transformers, also on CPUs; `sglang_backend`: a stock SGLang
engine with aux capture, GPUs, configured by the `sglang` section)."""

from __future__ import annotations

import os

from eyas.config import ExtractSettings, SglangSettings
from eyas.core.layer_ids import resolve_aux_layer_ids
from eyas.model.target import read_config, resolve_device


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
    `model.aux_layer_ids` (None: the default taps of the target's layer count)."""
    common = dict(
        layer_ids=resolve_aux_layer_ids(read_config(model_dir), aux_layer_ids),
        dtype=settings.dtype,
        storage=settings.storage,
        chunk_tokens=settings.chunk_tokens,
        writer_threads=settings.writer_threads,
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
