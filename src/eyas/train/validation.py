"""The end of an epoch: the coverage check (every sample exactly once per complete epoch) and, with
`select_by_tau`, the held-out metrics of the weights, whose best epoch the checkpointer keeps."""

from __future__ import annotations

import logging

import torch

from eyas.model.drafter import Eagle3Drafter
from eyas.store import read_token_shard
from eyas.train import distributed
from eyas.train.checkpoint import Checkpointer
from eyas.train.heldout import evaluate_offline
from eyas.train.loader import MIN_LENGTH, trainable
from eyas.train.parallel import Replicated
from eyas.train.run_state import RunState

log = logging.getLogger("eyas.train")


def _has_trainable_sample(token_shard: str) -> bool:
    shard = read_token_shard(token_shard)
    offsets = shard.sample_offsets
    return any(
        trainable(shard.loss_mask, int(offsets[s]), int(offsets[s + 1])) for s in range(shard.num_samples)
    )


class HeldoutMetrics:
    """Offline metrics (simulated tau, per-step accuracy) of given weights on the held-out stores."""

    def __init__(self, heldout: dict, model_dir: str, expected: dict, ttt_steps: int, device: torch.device):
        """Refuses held-out shards without a sample to measure now (the loader's `trainable`), not
        at the end of the first epoch, where the held-out loader would."""
        shards = heldout["token_shards"]
        if not any(map(_has_trainable_sample, shards)):
            raise ValueError(
                f"train.select_by_tau: the held-out token shards have no samples ({', '.join(shards)}) "
                f"to measure (at least {MIN_LENGTH} tokens with a loss token after the second): no "
                "conversation fell in the eval split (each is held out when its hash is below "
                "data.eval_fraction); raise data.eval_fraction or add conversations"
            )
        self.heldout = heldout
        self.model_dir = model_dir
        self.expected = expected
        self.ttt_steps = ttt_steps
        self.device = device

    def __call__(self, model: Eagle3Drafter) -> dict:
        metrics = evaluate_offline(
            model,
            self.heldout["token_shards"],
            self.heldout["hidden_stores"],
            self.model_dir,
            ttt_steps=self.ttt_steps,
            expected_provenance=self.expected,
            device=str(self.device),
        )
        model.train()
        return metrics


class EpochEnd:
    """Closes an epoch: records it in `run.epochs` (collective: every rank calls it)."""

    def __init__(self, spread: Replicated, checkpointer: Checkpointer, heldout: HeldoutMetrics | None):
        self.spread, self.checkpointer, self.heldout = spread, checkpointer, heldout

    def __call__(self, run: RunState, complete: bool, padded: int, pace: dict | None = None) -> None:
        """`complete`: epoch `run.epoch` ran to its end (not cut by max_steps), so every sample must
        have been seen exactly once over all ranks. `padded`: its empty micro-batch slots. `pace`:
        this process's seconds of the epoch (`EpochPace.log`), kept in the record."""
        world = self.spread.world
        counts = distributed.all_reduce_sum(run.seen.clone(), world)
        record = {
            "epoch": run.epoch,
            "step": run.step,
            "complete": complete,
            "samples": int((counts > 0).sum()),
            "padded_microbatches": padded,
            **(pace or {}),
        }
        if complete and not bool((counts == 1).all()):
            raise RuntimeError(
                f"epoch {run.epoch}: {int((counts == 0).sum())} samples unseen, "
                f"{int((counts > 1).sum())} seen more than once"
            )
        if self.heldout is not None:
            whole = self.spread.full_drafter()
            if world.main:
                metrics = self.heldout(whole)
                record["simulated_tau"] = metrics["simulated_tau"]
                record["conditional_accuracy"] = metrics["conditional_accuracy"]
                record["accuracy"] = metrics["accuracy"]
                record["walked_tau_by_k"] = metrics["walked_tau_by_k"]
                record["heldout_seconds"] = round(metrics["seconds"], 3)
                self.checkpointer.keep_if_best(run, record, whole)
                walked = " ".join(f"{w:.3f}" if w is not None else "-" for w in metrics["walked_tau_by_k"])
                log.info(
                    "epoch %d: held-out simulated tau %.4f, walked tau by k %s (%.1f s)",
                    run.epoch, record["simulated_tau"], walked, metrics["seconds"],
                )  # fmt: skip
            distributed.barrier(world)
        run.epochs.append(record)
        run.seen = torch.zeros_like(run.seen)
