"""Export the trained drafter as a vLLM speculators Eagle3Speculator directory."""

import json
import os

from eyas.core.logs import setup_stage_logging
from eyas.export import export_speculators
from eyas.model.target import read_config

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "export_speculators")
target = read_config(sm.input.model)
# export.verifier (null = this job's model dir, absolute, so speculators resolves it offline from any
# working directory); export_speculators refuses a name that cannot resolve.
verifier = sm.params.verifier or os.path.abspath(sm.input.model)
info = export_speculators(
    sm.input.drafter,
    sm.output.export,
    verifier=verifier,
    verifier_architectures=target.get("architectures") or ["LlamaForCausalLM"],
    speculative_tokens=sm.params.speculative_tokens,
)
if not info["verifier_checked"]:
    log.warning(
        "export: export.verifier %r is a Hub id not in the local Hugging Face cache: not checked offline",
        verifier,
    )
log.info("export: %s", json.dumps(info))
