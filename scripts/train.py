"""Train the EAGLE-3 drafter on the train split's hidden stores (torchrun when train.nproc > 1)."""

import json
import sys

from eyas.config import TrainSettings, stage_settings
from eyas.core.gpus import claim_gpus
from eyas.core.logs import setup_stage_logging
from eyas.train.job import EXIT_PREEMPTED, train_inputs, train_job
from eyas.train.preemption import Preempted


def main(sm) -> None:
    log = setup_stage_logging(sm.log[0], "train")
    claim_gpus(sm.resources.get("gpu", 0), log=log)  # devices of its own before CUDA starts
    settings = stage_settings(TrainSettings, sm.params.settings)
    inputs = train_inputs(
        tokens_dir=sm.input.tokens,
        hidden_stores=list(sm.input.stores),
        manifests=list(sm.input.manifests),
        vocab_path=sm.input.vocab,
        model_dir=sm.input.model,
        model_id=sm.params.model_id,
        out_dir=sm.output.drafter,
        log_path=sm.output.log_csv,
        heldout=(sm.input.heldout_tokens, list(sm.input.heldout_stores)) if settings.select_by_tau else None,
        threads=max(1, sm.threads // settings.nproc),  # per process
    )
    try:
        stats = train_job(settings, inputs, launch_log=sm.log[0])
    except Preempted as exc:  # SIGTERM: checkpoint saved; the rerun (SLURM's requeue, Snakemake) resumes
        log.error("%s", exc)
        sys.exit(EXIT_PREEMPTED)
    log.info("train: %s", json.dumps(stats))


# The loader's reader processes (`train.loader_processes`) come from a forkserver, which imports this
# script as __mp_main__ (multiprocessing preloads __main__): the guard keeps that import from running
# the stage again.
if __name__ == "__main__":
    main(snakemake)  # noqa: F821
