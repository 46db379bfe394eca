"""Run the target over one token shard and write its hidden-state store."""

import json
from pathlib import Path

from eyas.extract.hf_backend import extract_shard
from eyas.gpus import claim_gpus
from eyas.logs import setup_stage_logging
from eyas.target import default_aux_layer_ids, read_config, resolve_device

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "extract")
claim_gpus(sm.resources.get("gpu", 0), log=log)  # a device of its own before CUDA starts
settings = sm.params.settings
layer_ids = sm.params.layer_ids or default_aux_layer_ids(read_config(sm.input.model)["num_hidden_layers"])
shard = Path(sm.input.tokens) / f"shard-{sm.wildcards.shard}.zarr"
stats = extract_shard(
    str(shard),
    sm.output.store,
    sm.input.model,
    layer_ids=layer_ids,
    device=resolve_device(settings["device"]),
    dtype=settings["dtype"],
    token_budget=settings["token_budget"],
    storage=settings["storage"],
    chunk_tokens=settings["chunk_tokens"],
    writer_threads=settings["writer_threads"],
    model_id=sm.params.model_id,
    trust_remote_code=sm.params.trust_remote_code,
    threads=sm.threads,
)
log.info("extract %s/%s: %s", sm.wildcards.split, sm.wildcards.shard, json.dumps(stats))
