"""The training log: one CSV row per optimizer step (`log.csv`), one per finished epoch (`epochs.csv`).

While training, rank 0 appends each row to `<log_path>.partial` as it is taken (so a long run can be
followed and a killed one inspected); at the end both files appear atomically and the partial one
goes. The rows themselves are part of the run state (`RunState.log_rows`): a resumed run rewrites
the partial file from them, so its log equals an uninterrupted run's byte for byte.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from eyas.core.atomic import atomic_file

EPOCH_COLUMNS = ("epoch", "step", "complete", "samples", "padded_microbatches", "simulated_tau")


class TrainLog:
    """Owns `log.csv`, its `.partial` copy and `epochs.csv`. Writes on rank 0 only (`main`)."""

    def __init__(self, log_path: str | os.PathLike, ttt_steps: int, main: bool):
        self.path = Path(log_path)
        self.partial = Path(str(log_path) + ".partial")
        self.ttt_steps = ttt_steps
        self.main = main
        self.columns = ["step", "epoch", "lr", "loss", *(f"acc_{k}" for k in range(ttt_steps)), "tokens",
                        "grad_norm"]  # fmt: skip
        self._fh = None
        self._writer = None

    def start(self, rows: list[list]) -> None:
        """Open the partial log with the rows a resumed run already has."""
        if not self.main:
            return
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        with open(self.partial, "w", newline="") as fh:
            csv.writer(fh).writerows([self.columns, *rows])
        self._fh = open(self.partial, "a", newline="")  # noqa: SIM115 - closed by close()
        self._writer = csv.writer(self._fh)

    def append(self, row: list) -> None:
        """One step's row, flushed at once."""
        if self._writer is not None:
            self._writer.writerow(row)
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = self._writer = None

    def finish(self, rows: list[list], epochs: list[dict]) -> None:
        """Rank 0 at the end: `log.csv` and `epochs.csv` atomically; the partial log goes."""
        with atomic_file(self.path) as fh:
            csv.writer(fh).writerows([self.columns, *rows])
        write_epochs(self.path.with_name("epochs.csv"), epochs, self.ttt_steps)
        self.partial.unlink(missing_ok=True)


def write_epochs(path: Path, epochs: list[dict], steps: int) -> None:
    """One row per finished epoch: coverage, padding and held-out metrics (empty when not measured);
    `walked_tau_k<k>` is the held-out walked tau at chain length k = 1..steps."""
    columns = [*EPOCH_COLUMNS, *(f"cond_acc_{k}" for k in range(steps)), *(f"acc_{k}" for k in range(steps)),
               *(f"walked_tau_k{k + 1}" for k in range(steps))]  # fmt: skip
    with atomic_file(path) as fh:
        out = csv.writer(fh)
        out.writerow(columns)
        for e in epochs:
            cond = e.get("conditional_accuracy") or [None] * steps
            acc = e.get("accuracy") or [None] * steps
            walked = e.get("walked_tau_by_k") or [None] * steps
            out.writerow([*(e.get(c) for c in EPOCH_COLUMNS), *cond, *acc, *walked])
