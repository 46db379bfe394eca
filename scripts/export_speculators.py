"""Export the trained drafter as a vLLM speculators Eagle3Speculator directory."""

import json

from eyas.export import export_speculators
from eyas.logs import setup_stage_logging
from eyas.target import read_config

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "export_speculators")
target = read_config(sm.input.model)
info = export_speculators(
    sm.input.drafter,
    sm.output.export,
    verifier=sm.params.verifier,
    verifier_architectures=target.get("architectures") or ["LlamaForCausalLM"],
    speculative_tokens=sm.params.speculative_tokens,
)
log.info("export: %s", json.dumps(info))
