"""Extract one demo data file from the llamafactory sdist (fetched from PyPI)."""

from pathlib import Path

from eyas.assets import fetch_default_data
from eyas.core.logs import setup_stage_logging

log = setup_stage_logging(snakemake.log[0], "fetch_data")  # noqa: F821
out = Path(snakemake.output.data)  # noqa: F821
fetch_default_data(out.parent, [out.name])
log.info("data file written to %s", out)
