"""The target writes user turns itself (the `target` data source): Hugging Face or SGLang backend."""

import json

import torch

from eyas.config import PromptSettings, RegenerateSettings, SglangSettings, stage_settings
from eyas.core.gpus import claim_gpus
from eyas.core.logs import setup_stage_logging
from eyas.regenerate.prompts import run_prompts


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "prompts")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
    torch.set_num_threads(sm.threads)
    stats = run_prompts(
        sm.output.prompts,
        sm.output.rejects,
        sm.output.stats,
        sm.input.model,
        list(sm.input.tool_files),
        settings=stage_settings(PromptSettings, sm.params.settings),
        answer_settings=stage_settings(RegenerateSettings, sm.params.answer_settings),
        engine_settings=stage_settings(SglangSettings, sm.params.engine_settings),  # the sglang section
        trust_remote_code=sm.params.trust_remote_code,
    )
    log.info("prompts: %s", json.dumps(stats, ensure_ascii=False))


# SGLang starts its scheduler with multiprocessing's spawn, which re-imports this script as
# __mp_main__: the guard keeps that import from running the stage again.
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
