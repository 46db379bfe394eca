"""Validate one hidden store against its token shard; write its manifest (training requires it)."""

import json
from pathlib import Path

from eyas.core.layer_ids import resolve_aux_layer_ids
from eyas.core.logs import setup_stage_logging
from eyas.core.provenance import model_hash
from eyas.model.target import read_config
from eyas.store import shard_name
from eyas.validate import validate_store, write_manifest

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "validate")
layer_ids = resolve_aux_layer_ids(read_config(sm.input.model), sm.params.layer_ids)
expected = {"model_id": sm.params.model_id, "model_hash": model_hash(sm.input.model), "layer_ids": layer_ids}
shard = Path(sm.input.tokens) / shard_name(sm.wildcards.shard)
manifest = validate_store(shard, sm.input.store, expected, threads=sm.threads)
write_manifest(sm.output.manifest, manifest)
log.info(
    "validate %s/%s: %s",
    sm.wildcards.split,
    sm.wildcards.shard,
    json.dumps({k: manifest[k] for k in ("arrays", "nonfinite", "seconds")}),
)
