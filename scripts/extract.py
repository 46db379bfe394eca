"""Run the target over one token shard and write its hidden-state store (HF or SGLang backend)."""

import dataclasses
import json
from pathlib import Path

from eyas.config import ExtractSettings, stage_settings
from eyas.gpus import claim_gpus
from eyas.layer_ids import resolve_aux_layer_ids
from eyas.logs import setup_stage_logging
from eyas.store import shard_name
from eyas.target import read_config, resolve_device


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "extract")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
    settings = stage_settings(ExtractSettings, sm.params.settings)
    layer_ids = resolve_aux_layer_ids(read_config(sm.input.model), sm.params.layer_ids)
    shard = Path(sm.input.tokens) / shard_name(sm.wildcards.shard)
    common = dict(
        layer_ids=layer_ids,
        dtype=settings.dtype,
        storage=settings.storage,
        chunk_tokens=settings.chunk_tokens,
        writer_threads=settings.writer_threads,
        model_id=sm.params.model_id,
        trust_remote_code=sm.params.trust_remote_code,
        threads=sm.threads,
    )
    if settings.backend == "sglang":
        from eyas.extract.sglang_backend import extract_shard_sglang

        stats = extract_shard_sglang(
            str(shard),
            sm.output.store,
            sm.input.model,
            settings=dataclasses.asdict(settings.sglang),
            **common,
        )
    else:
        from eyas.extract.hf_backend import extract_shard

        stats = extract_shard(
            str(shard),
            sm.output.store,
            sm.input.model,
            device=resolve_device(settings.device),
            token_budget=settings.token_budget,
            **common,
        )
    log.info("extract %s/%s: %s", sm.wildcards.split, sm.wildcards.shard, json.dumps(stats))


# SGLang starts its scheduler with multiprocessing's spawn, which re-imports this script as
# __mp_main__: the guard keeps that import from running the stage again.
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
