"""Real speculative decoding of the trained drafter and baselines on one evaluation set (wildcard `set`)."""

from eyas.config import EvaluateSettings, stage_settings
from eyas.core.logs import setup_stage_logging
from eyas.evaluate.drafters import baseline_dirs
from eyas.evaluate.stage_specdec import run_specdec_set

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], f"specdec.{sm.wildcards.set}")
result = run_specdec_set(
    set_name=sm.wildcards.set,
    set_path=sm.input.prompts,
    set_format=sm.params.set_format,
    drafter_dir=sm.input.drafter,
    model_dir=sm.input.model,
    out_json=sm.output.json,
    settings=stage_settings(EvaluateSettings, sm.params.settings),
    baselines=baseline_dirs(sm.params.baseline_names, sm.input.baselines),
    threads=sm.threads,
    trust_remote_code=sm.params.trust_remote_code,
)
log.info("specdec %s: tau %s", sm.wildcards.set, {d: r["tau"] for d, r in result["reports"].items()})
