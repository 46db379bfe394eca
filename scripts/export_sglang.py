"""Export the trained drafter as an SGLang-loadable LlamaForCausalLMEagle3 directory."""

import json

from eyas.core.layer_ids import text_model_type
from eyas.core.logs import setup_stage_logging
from eyas.export import export_sglang
from eyas.model.target import read_config

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "export")
info = export_sglang(sm.input.drafter, sm.output.export, text_model_type(read_config(sm.input.model)))
log.info("export: %s", json.dumps(info))
