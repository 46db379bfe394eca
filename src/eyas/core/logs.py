"""Logging for stage scripts: everything goes to the rule's log file and to the console."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, data):
        for stream in self.streams:
            stream.write(data)
            stream.flush()
        return len(data)

    def flush(self):
        for stream in self.streams:
            stream.flush()

    def isatty(self):
        return False


def setup_stage_logging(log_path: str | os.PathLike | None, name: str) -> logging.Logger:
    """Tee stdout/stderr (progress bars included) into `log_path` and return the stage's logger.

    `kill -USR1 <pid>` writes every thread's Python stack into the log and the job goes on: where a
    slow or stuck stage spends its time, without a profiler on the machine."""
    if log_path:
        log_file = open(log_path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 (lives for the job)
        sys.stdout = _Tee(sys.__stdout__, log_file)
        sys.stderr = _Tee(sys.__stderr__, log_file)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=log_file, all_threads=True, chain=False)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s eyas.{name} %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    return logging.getLogger(f"eyas.{name}")
