"""Subprocess entry for crash tests: `python tests/train_worker.py SPEC [STALL_AT_STEP]`.

Runs `eyas.train.job` on SPEC; with STALL_AT_STEP the trainer blocks after that optimizer step (its
log row written) so the test can SIGKILL it at a known point, like a node lost mid-run.
"""

import sys
import time

from eyas.train import job
from eyas.train.csvlog import TrainLog

if len(sys.argv) > 2:
    stall_at = int(sys.argv[2])
    append = TrainLog.append

    def stall(self, row: list) -> None:
        append(self, row)
        if row[0] == stall_at:
            while True:
                time.sleep(1)

    TrainLog.append = stall
job.main(sys.argv[1:2])
