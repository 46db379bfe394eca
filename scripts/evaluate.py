"""Offline metrics and real speculative decoding of the trained drafter on held-out data."""

import json
from pathlib import Path

from eyas.evaluate.stage import run_evaluation
from eyas.logs import setup_stage_logging

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "evaluate")
summary = run_evaluation(
    drafter_dir=sm.input.drafter,
    conversations=sm.input.conversations,
    token_shards=sorted(str(p) for p in Path(sm.input.tokens).glob("shard-*.zarr")),
    hidden_stores=list(sm.input.stores),
    model_dir=sm.input.model,
    out_summary=sm.output.summary,
    out_plot=sm.output.plot,
    settings=sm.params.settings,
    ttt_steps=sm.params.ttt_steps,
    threads=sm.threads,
    trust_remote_code=sm.params.trust_remote_code,
)
log.info("evaluate: tau=%s", json.dumps(summary.get("specdec", {}).get("tau")))
