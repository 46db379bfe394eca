"""Conversations of one split -> loss-masked token shards (Zarr), rejects and stats."""

import json
from pathlib import Path

from eyas.core.atomic import atomic_dir
from eyas.core.logs import setup_stage_logging
from eyas.data.tokenize import tokenize_split
from eyas.store import shard_name


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "tokenize")
    with atomic_dir(sm.output.shards) as tmp:
        shards = [str(Path(tmp) / shard_name(i)) for i in range(sm.params.num_shards)]
        stats = tokenize_split(
            sm.input.conversations,
            sm.input.model,
            shards,
            str(Path(tmp) / "rejects.jsonl"),
            str(Path(tmp) / "stats.json"),
            split=sm.wildcards.split,
            max_length=sm.params.max_length,
            model_id=sm.params.model_id,
            trust_remote_code=sm.params.trust_remote_code,
            workers=sm.threads,
        )
    log.info("tokenize %s: %s", sm.wildcards.split, json.dumps(stats))


# A large split is tokenized on worker processes started with multiprocessing's spawn, which re-imports
# this script as __mp_main__: the guard keeps that import from running the stage again.
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
