"""Served evaluation: every set, drafter and k with the target in SGLang (evaluate.backend sglang)."""

from eyas.config import EvaluateSettings, SglangSettings, stage_settings
from eyas.core.gpus import claim_gpus
from eyas.core.logs import setup_stage_logging
from eyas.evaluate.drafters import baseline_dirs
from eyas.evaluate.stage_served import run_served


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "served")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before the engine starts
    result = run_served(
        set_paths=dict(zip(sm.params.set_names, sm.input.prompts, strict=True)),
        set_formats=sm.params.set_formats,
        drafter_dir=sm.input.drafter,
        export_dir=sm.input.export,
        model_dir=sm.input.model,
        out_json=sm.output.json,
        settings=stage_settings(EvaluateSettings, sm.params.settings),
        engine_settings=stage_settings(SglangSettings, sm.params.engine_settings),
        baselines=baseline_dirs(sm.params.baseline_names, sm.input.baselines),
        trust_remote_code=sm.params.trust_remote_code,
    )
    for set_name, drafters in result["sets"].items():
        log.info(
            "served %s: tau %s",
            set_name,
            {d: {k: r["tau"] for k, r in by_k.items()} for d, by_k in drafters.items()},
        )
        for k, report in drafters["trained"].items():  # where the drafter is weak: tau by input file
            by_origin = {o: f"{r['tau']:.3f} ({r['prompts']})" for o, r in report["tau_by_origin"].items()}
            log.info("served %s / trained / k=%s by input: %s", set_name, k, by_origin)


# SGLang's scheduler is spawned (multiprocessing spawn re-imports this script as __mp_main__).
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
