"""Raw prompt files -> normalized, deduplicated conversations split into train / eval."""

import json

from eyas.config import DataSettings, stage_settings
from eyas.core.logs import setup_stage_logging
from eyas.data.prepare import prepare

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "prepare")
settings = stage_settings(DataSettings, sm.params.settings)
stats = prepare(
    list(zip(sm.input.data, sm.params.formats, strict=True)),
    sm.output.train,
    sm.output.eval,
    sm.output.rejects,
    sm.output.stats,
    eval_fraction=settings.eval_fraction,
    eval_max=settings.eval_max,
    seed=settings.seed,
    max_conversations=settings.max_conversations,
)
log.info("prepare: %s", json.dumps(stats))
if stats["kept"] and not stats["splits"]["eval"]:  # train refuses it under train.select_by_tau
    log.warning(
        "prepare: no conversation fell in the eval split (data.eval_fraction %s of %d kept): "
        "the held-out metrics and the heldout evaluation set have nothing to read",
        settings.eval_fraction,
        stats["kept"],
    )
