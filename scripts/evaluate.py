"""Offline metrics of the trained drafter and baselines, merged with the per-set speculative decoding
JSONs (scripts/specdec.py) into summary.json and the acceptance plot."""

import json

from eyas.config import EvaluateSettings, stage_settings
from eyas.core.logs import setup_stage_logging
from eyas.evaluate.drafters import baseline_dirs
from eyas.evaluate.stage_merge import run_evaluation
from eyas.store import shard_paths

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "evaluate")
summary = run_evaluation(
    drafter_dir=sm.input.drafter,
    specdec_paths=dict(zip(sm.params.set_names, sm.input.specdec, strict=True)),
    token_shards=shard_paths(sm.input.tokens),
    hidden_stores=list(sm.input.stores),
    model_dir=sm.input.model,
    out_summary=sm.output.summary,
    out_plot=sm.output.plot,
    settings=stage_settings(EvaluateSettings, sm.params.settings),
    ttt_steps=sm.params.ttt_steps,
    baselines=baseline_dirs(sm.params.baseline_names, sm.input.baselines),
    threads=sm.threads,
    served_path=sm.input.served[0] if sm.input.served else None,
)
log.info("evaluate: tau by set %s", json.dumps(summary["headline"]["tau_by_set"]))
