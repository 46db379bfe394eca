"""Run training from a JSON spec: in this process, or as `torchrun ... -m eyas.train.job SPEC` ranks.

spec = {"settings": TrainSettings fields, "inputs": keyword arguments of `trainer.train`,
"stats_path": where rank 0 writes the returned statistics (JSON)}.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from eyas.config import TrainSettings
from eyas.core.atomic import atomic_file


def run(spec: dict) -> dict:
    """Train in this process (joining torchrun's process group when launched by it)."""
    from eyas.train import distributed
    from eyas.train.trainer import train

    settings = TrainSettings(**spec["settings"])
    world = distributed.init_from_env("cuda" if settings.device == "cuda" else "cpu")
    try:
        stats = train(settings, **spec["inputs"])
        if world.main and spec.get("stats_path"):
            with atomic_file(spec["stats_path"]) as fh:
                json.dump(stats, fh, indent=2)
    finally:
        if world.active:
            import torch.distributed as dist

            dist.destroy_process_group()
    return stats


def train_inputs(
    *,
    tokens_dir: str,
    hidden_stores: list[str],
    manifests: list[str] | None,
    vocab_path: str,
    model_dir: str,
    model_id: str,
    out_dir: str,
    log_path: str,
    heldout: tuple[str, list[str]] | None,
    threads: int | None,
) -> dict:
    """`trainer.train`'s keyword inputs from a run's paths: the token shards of `tokens_dir`, the
    provenance every store must carry (the model's own hash; tokenizer and template hashes of the
    first token shard) and, with `heldout` = (eval tokens dir, eval stores), the held-out pairs."""
    from eyas.core.provenance import model_hash
    from eyas.store import read_token_shard, shard_paths

    token_shards = shard_paths(tokens_dir)
    first = read_token_shard(token_shards[0]).attrs
    held = None if heldout is None else {"token_shards": shard_paths(heldout[0]), "hidden_stores": heldout[1]}
    return dict(
        token_shards=token_shards,
        hidden_stores=list(hidden_stores),
        vocab_path=vocab_path,
        model_dir=model_dir,
        out_dir=out_dir,
        log_path=log_path,
        expected_provenance={
            "model_id": model_id,
            "model_hash": model_hash(model_dir),
            "tokenizer_hash": first["tokenizer_hash"],
            "chat_template_hash": first["chat_template_hash"],
        },
        manifests=manifests,
        heldout=held,
        threads=threads,
    )


def train_job(settings: TrainSettings, inputs: dict, launch_log: str | None = None) -> dict:
    """Train with `settings.nproc` processes: in-process for 1, through torchrun for more."""
    import dataclasses

    if settings.nproc <= 1:
        return run({"settings": dataclasses.asdict(settings), "inputs": inputs})
    from eyas.train.launch import launch

    with tempfile.TemporaryDirectory(prefix="eyas-train-") as tmp:
        spec_path, stats_path = Path(tmp) / "spec.json", Path(tmp) / "stats.json"
        spec = {"settings": dataclasses.asdict(settings), "inputs": inputs, "stats_path": str(stats_path)}
        spec_path.write_text(json.dumps(spec))
        launch(settings.nproc, str(spec_path), launch_log)
        return json.loads(stats_path.read_text())


EXIT_PREEMPTED = 128 + 15  # the shell's code for "ended by SIGTERM": stopped on it, checkpoint saved


def main(argv: list[str]) -> None:
    import logging

    from eyas.train.preemption import Preempted

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run(json.loads(Path(argv[0]).read_text()))
    except Preempted as exc:
        logging.getLogger("eyas.train").error("%s", exc)
        sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
    main(sys.argv[1:])
