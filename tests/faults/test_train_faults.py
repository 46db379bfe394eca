"""Training faults: a loss that turns NaN/Inf, corrupt or truncated checkpoints, a full disk while a
checkpoint is saved, SIGTERM (cluster preemption) mid-run. Every case ends in a clean stop with an
error naming the step and file, or in a resume whose result equals an uninterrupted run's bitwise.

The training data is the tiny target's own greedy text (`tests/trainkit.py`, the `data` fixture).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from trainkit import csv_rows, run, settings

from eyas.model.drafter import Eagle3Drafter
from eyas.train.trainer import NonFiniteLoss

torch.set_num_threads(1)


def weights(path) -> dict:
    return Eagle3Drafter.from_pretrained(path).state_dict()


def assert_same_weights(a, b) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def test_nan_loss_stops_at_that_step_naming_the_last_good_checkpoint(data, tmp_path, ledger):
    # lr 1e8 (warm-up 2.5e7, 5e7, ...): AdamW moves each weight by ~lr per step; the gradient norm is
    # NaN by step 3 (measured: step 2's loss is still finite)
    s = settings(lr=1e8, warmup_steps=4, max_steps=30, epochs=10, checkpoint_every=2)
    with ledger.case("fault", "loss turns NaN/Inf (absurd lr)", "stop at that step; names last checkpoint"):
        with pytest.raises(NonFiniteLoss) as err:
            run(data, tmp_path, s)
        message = str(err.value)
        bad = int(re.search(r"at step (\d+)", message).group(1))
        logged = csv_rows(tmp_path / "log.csv.partial")
        assert logged == bad - 1 and bad > 2, (logged, message)  # every step before it, none after
        ckpt = tmp_path / "drafter-checkpoint"
        saved = (bad - 1) // 2 * 2  # the last multiple of checkpoint_every before the bad step
        assert f"last good checkpoint: {ckpt} (step {saved})" in message, message
        state = torch.load(ckpt / "train_state.pt", weights_only=True)
        assert state["step"] == saved and all(math.isfinite(r[3]) for r in state["log_rows"])
        assert all(torch.isfinite(t).all() for t in weights(ckpt).values())
        assert not (tmp_path / "drafter").exists()  # no output that looks finished
