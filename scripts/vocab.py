"""Draft vocabulary from the masked-token frequencies of the train split."""

import json

from eyas.core.atomic import atomic_file
from eyas.core.logs import setup_stage_logging
from eyas.data.vocab import build_draft_vocab, save_draft_vocab
from eyas.model.target import read_config
from eyas.store import read_token_shard, shard_paths

sm = snakemake  # noqa: F821
log = setup_stage_logging(sm.log[0], "vocab")
shards = shard_paths(sm.input.tokens)
vocab_size = read_config(sm.input.model)["vocab_size"]
d2t, t2d, stats = build_draft_vocab(shards, vocab_size, sm.params.draft_vocab_size)
tokenizer_hash = read_token_shard(shards[0]).attrs["tokenizer_hash"]
save_draft_vocab(sm.output.vocab, d2t, t2d, stats, tokenizer_hash)
with atomic_file(sm.output.stats) as fh:  # every output atomic: a killed job leaves no half JSON
    json.dump(stats, fh, indent=2)
log.info("vocab: %s", json.dumps(stats))
