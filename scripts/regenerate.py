"""Regenerate assistant turns with the target (optional stage): Hugging Face or SGLang backend."""

import json

import torch

from eyas.atomic import atomic_file
from eyas.config import RegenerateSettings, SglangSettings, stage_settings
from eyas.data.regenerate import HFGenerator, SglangGenerator, regenerate_split
from eyas.gpus import claim_gpus
from eyas.logs import setup_stage_logging
from eyas.target import load_target, load_tokenizer, resolve_device


def with_sglang(sm, settings, tokenizer, run: dict) -> dict:
    from eyas.sglang_engine import base_engine_args, generation_engine_args, start_engine, user_engine_args

    engine_settings = stage_settings(SglangSettings, sm.params.engine_settings)  # extract.sglang
    base = base_engine_args(engine_settings, sm.input.model, "bfloat16", sm.params.trust_remote_code)
    base |= user_engine_args(engine_settings.engine_args, None)
    engine = start_engine(generation_engine_args(base, settings.seed), speculative=False)
    try:
        generate = SglangGenerator(
            engine,
            eos_token_ids={tokenizer.eos_token_id},
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
        )
        return regenerate_split(sm.input.conversations, sm.output.conversations, generate, tokenizer, **run)
    finally:
        engine.shutdown()


def with_hf(sm, settings, tokenizer, run: dict) -> dict:
    device = resolve_device(settings.device)
    model = load_target(sm.input.model, device=device, trust_remote_code=sm.params.trust_remote_code)
    generate = HFGenerator(
        model,
        tokenizer,
        batch_size=settings.batch_size,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
    )
    return regenerate_split(sm.input.conversations, sm.output.conversations, generate, tokenizer, **run)


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "regenerate")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
    settings = stage_settings(RegenerateSettings, sm.params.settings)
    torch.set_num_threads(sm.threads)
    tokenizer = load_tokenizer(sm.input.model, trust_remote_code=sm.params.trust_remote_code)
    run = dict(
        # the regenerated sample must still fit tokenize's max_length
        max_prompt_length=sm.params.max_length - settings.max_new_tokens,
        samples=settings.samples,
        turns=settings.turns,
        seed=settings.seed,
    )
    backend = with_sglang if settings.backend == "sglang" else with_hf
    stats = backend(sm, settings, tokenizer, run)
    with atomic_file(sm.output.stats) as fh:
        json.dump(stats, fh, indent=2)
    log.info("regenerate %s: %s", sm.wildcards.split, json.dumps(stats))


# SGLang starts its scheduler with multiprocessing's spawn, which re-imports this script as
# __mp_main__: the guard keeps that import from running the stage again (it would fail on the missing
# `snakemake` object, and the engine would die at start-up).
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
