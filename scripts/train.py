"""Train the EAGLE-3 drafter on the train split's hidden stores (torchrun when train.nproc > 1)."""

import json

from eyas.config import TrainSettings, stage_settings
from eyas.gpus import claim_gpus
from eyas.logs import setup_stage_logging
from eyas.provenance import model_hash
from eyas.store import read_token_shard, shard_paths
from eyas.train.job import train_job

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "train")
claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
settings = stage_settings(TrainSettings, sm.params.settings)
token_shards = shard_paths(sm.input.tokens)
first = read_token_shard(token_shards[0]).attrs
expected = {
    "model_id": sm.params.model_id,
    "model_hash": model_hash(sm.input.model),
    "tokenizer_hash": first["tokenizer_hash"],
    "chat_template_hash": first["chat_template_hash"],
}
heldout = {
    "token_shards": shard_paths(sm.input.heldout_tokens),
    "hidden_stores": list(sm.input.heldout_stores),
}
inputs = dict(
    token_shards=token_shards,
    hidden_stores=list(sm.input.stores),
    vocab_path=sm.input.vocab,
    model_dir=sm.input.model,
    out_dir=sm.output.drafter,
    log_path=sm.output.log_csv,
    expected_provenance=expected,
    manifests=list(sm.input.manifests),
    heldout=heldout if settings.select_by_tau else None,
    threads=max(1, sm.threads // settings.nproc),  # per process
)
stats = train_job(settings, inputs, launch_log=sm.log[0])
log.info("train: %s", json.dumps(stats))
