"""The torchrun launcher: the training CLI run as `nproc` ranks on this node, with SIGTERM passed on so a
preempted job's ranks stop after the same step with a checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from eyas.train.preemption import Preempted


def torchrun_command(nproc: int, spec_path: str) -> list[str]:
    """`torchrun --standalone` of the training CLI with `nproc` processes on this node."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "eyas.train.job",
        spec_path,
    ]


# How long the torchrun agent lets its ranks finish after it is sent SIGTERM before it SIGKILLs them
# (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, read by recent torch, 2.13 here; older ones keep 30 s): the ranks
# save a checkpoint first, which can take longer at large sizes. The cluster's own SIGKILL (SLURM's
# KillWait) still bounds it.
SHUTDOWN_TIMEOUT_S = "600"


def launch(nproc: int, spec_path: str, log_path: str | None = None) -> None:
    """Run the training CLI under torchrun; raise naming the log if any rank fails. SIGTERM to this
    process is passed on to torchrun, which passes it to the ranks: they stop after the same step with
    a checkpoint (preemption.StopRequest), and this raises `Preempted`."""
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": SHUTDOWN_TIMEOUT_S, **os.environ}
    signalled: list[int] = []
    out = open(log_path, "a") if log_path else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            torchrun_command(nproc, spec_path), stdout=out, stderr=subprocess.STDOUT, env=env
        )

        def forward(signum, frame) -> None:
            signalled.append(signum)
            proc.send_signal(signum)

        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, forward)
        try:
            returncode = proc.wait()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    finally:
        if out:
            out.close()
    if returncode and signalled:
        raise Preempted(
            f"train: torchrun's {nproc} ranks stopped on SIGTERM (exit {returncode}); see {log_path}"
        )
    if returncode:
        raise RuntimeError(f"torchrun with {nproc} processes failed (exit {returncode}); see {log_path}")
