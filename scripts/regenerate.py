"""Regenerate assistant turns with the target (optional stage), every split in one job: Hugging Face or
SGLang backend."""

import json

import torch

from eyas.config import RegenerateSettings, SglangSettings, stage_settings
from eyas.core.gpus import claim_gpus
from eyas.core.logs import setup_stage_logging
from eyas.regenerate.responses import run_regenerate


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "regenerate")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
    torch.set_num_threads(sm.threads)
    splits = list(zip(sm.input.conversations, sm.output.conversations, sm.output.stats, strict=True))
    results = run_regenerate(
        splits,
        sm.input.model,
        settings=stage_settings(RegenerateSettings, sm.params.settings),
        engine_settings=stage_settings(SglangSettings, sm.params.engine_settings),
        max_length=sm.params.max_length,
        trust_remote_code=sm.params.trust_remote_code,
    )
    for (_, out, _), stats in zip(splits, results, strict=True):
        log.info("regenerate %s: %s", out, json.dumps(stats))


# SGLang starts its scheduler with multiprocessing's spawn, which re-imports this script as
# __mp_main__: the guard keeps that import from running the stage again (it would fail on the missing
# `snakemake` object, and the engine would die at start-up).
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
