"""Run the target over one token shard and write its hidden-state store (HF or SGLang backend)."""

import json
from pathlib import Path

from eyas.config import ExtractSettings, SglangSettings, stage_settings
from eyas.core.gpus import claim_gpus
from eyas.core.logs import setup_stage_logging
from eyas.extract.stage import run_extract
from eyas.store import shard_name


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "extract")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
    stats = run_extract(
        Path(sm.input.tokens) / shard_name(sm.wildcards.shard),
        sm.output.store,
        sm.input.model,
        stage_settings(ExtractSettings, sm.params.settings),
        engine_settings=stage_settings(SglangSettings, sm.params.engine_settings),
        aux_layer_ids=sm.params.layer_ids,
        model_id=sm.params.model_id,
        trust_remote_code=sm.params.trust_remote_code,
        threads=sm.threads,
    )
    log.info("extract %s/%s: %s", sm.wildcards.split, sm.wildcards.shard, json.dumps(stats))


# SGLang starts its scheduler with multiprocessing's spawn, which re-imports this script as
# __mp_main__: the guard keeps that import from running the stage again.
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
