"""Subprocess entry for crash tests: `python tests/train_worker.py SPEC [STALL_AT_STEP [hold]]`.

Runs `eyas.train.job` on SPEC; with STALL_AT_STEP the trainer blocks after that optimizer step (its
log row written) so the test can SIGKILL it at a known point, like a node lost mid-run. With `hold`
it waits there only until the file SPEC.go exists (the test signals it, then lets it go on), so a
signal's handler has run before the next step.
"""

import sys
import time
from pathlib import Path

from eyas.train import job
from eyas.train.csvlog import TrainLog

if len(sys.argv) > 2:
    stall_at = int(sys.argv[2])
    go = Path(sys.argv[1] + ".go") if sys.argv[3:] == ["hold"] else None
    append = TrainLog.append

    def stall(self, row: list) -> None:
        append(self, row)
        if row[0] == stall_at:
            while go is None or not go.exists():
                time.sleep(0.05)

    TrainLog.append = stall
job.main(sys.argv[1:2])
