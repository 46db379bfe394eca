"""Subprocess entry for crash tests: `python tests/train_worker.py SPEC [STALL_AT_STEP]`.

Runs `eyas.train.cli` on SPEC; with STALL_AT_STEP the trainer blocks after that optimizer step (its
log row written) so the test can SIGKILL it at a known point, like a node lost mid-run.
"""

import sys
import time

from eyas.train import cli
from eyas.train import trainer as trainer_mod

if len(sys.argv) > 2:
    stall_at = int(sys.argv[2])

    def stall(step: int) -> None:
        if step == stall_at:
            while True:
                time.sleep(1)

    trainer_mod._after_step = stall
cli.main(sys.argv[1:2])
