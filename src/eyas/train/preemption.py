"""Preemption: SIGTERM asks a training run to stop after the step in progress with a checkpoint
(`StopRequest`); the run then raises `Preempted`, and rerunning the job resumes from that checkpoint."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("eyas.train")


class Preempted(RuntimeError):
    """The run stopped on SIGTERM after saving a checkpoint; rerunning the job resumes from it."""


class StopRequest:
    """SIGTERM asks the run to stop: the handler only records it, and the train loop checkpoints after
    the step in progress and raises `Preempted`. A cluster sends SIGTERM to preempt or end a job, and
    SIGKILL a grace period later (SLURM: to every process of the job, KillWait seconds apart,
    https://slurm.schedmd.com/slurm.conf.html#OPT_KillWait; `sbatch --signal=TERM@60` asks for it a
    minute before the time limit, https://slurm.schedmd.com/sbatch.html#OPT_signal). Under torchrun
    every rank records its own request (from the cluster, or forwarded by the torchrun agent); the
    step's all-reduce sums the requests (`step.train_step`), so all ranks stop after the same step
    even when only one was signalled. Outside the main thread no handler can be set: no-op there."""

    SIGNALS = (signal.SIGTERM,)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.signum = signum
        log.warning("%s received: stopping after this step with a checkpoint",
                    signal.Signals(signum).name)  # fmt: skip

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None
