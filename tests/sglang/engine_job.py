"""One stage job on the stand-in engine (standin_engine.py): `python tests/sglang/engine_job.py JOB.json`.

What a Snakemake `script:` job of rule regenerate, prompts or served does after its settings are read:
`eyas.regenerate.responses.run_regenerate`, `eyas.regenerate.prompts.run_prompts` or
`eyas.evaluate.stage_served.run_served`, with the
stage's logging (`eyas.core.logs.setup_stage_logging`: the rule's log file and stderr), the output dirs
made first.
JOB.json holds the function's arguments, the settings sections as the rule passes them
(`dataclasses.asdict`). An error ends the
job with exit status 1 and its traceback, as it ends a Snakemake script job. The engine spawns its
processes, so this file is a `__main__` that spawn's children import without running it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def run(job: dict) -> None:
    from eyas.config import (
        EvaluateSettings,
        PromptSettings,
        RegenerateSettings,
        SglangSettings,
        stage_settings,
    )
    from eyas.core.logs import setup_stage_logging

    setup_stage_logging(job["log"], job["stage"])
    if job["stage"] == "served":
        outputs = [job["kwargs"]["out_json"]]
    else:  # regenerate: (conversations, out, stats, model); prompts: (out, rejects, stats, model, tools)
        outputs = job["paths"][1:3] if job["stage"] == "regenerate" else job["paths"][:3]
    for path in outputs:  # Snakemake makes the output dirs before it starts a job
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    import standin_engine

    standin_engine.install()
    engine_settings = stage_settings(SglangSettings, job["engine_settings"])
    if job["stage"] == "prompts":
        from eyas.regenerate.prompts import run_prompts

        run_prompts(
            *job["paths"],
            settings=stage_settings(PromptSettings, job["settings"]),
            answer_settings=stage_settings(RegenerateSettings, job["answer_settings"]),
            engine_settings=engine_settings,
        )
    elif job["stage"] == "regenerate":
        from eyas.regenerate.responses import run_regenerate

        conversations, out, stats, model = job["paths"]
        run_regenerate(
            [(conversations, out, stats)],
            model,
            settings=stage_settings(RegenerateSettings, job["settings"]),
            engine_settings=engine_settings,
            max_length=job["max_length"],
        )
    else:
        from eyas.evaluate.stage_served import run_served

        run_served(
            **job["kwargs"],
            settings=stage_settings(EvaluateSettings, job["settings"]),
            engine_settings=engine_settings,
        )


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()))
