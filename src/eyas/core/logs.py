"""Logging for stage scripts: everything goes to the rule's log file and to the console, and stays so
after an inference engine starts in the stage.

SGLang's `configure_logger` (`sglang/srt/utils/common.py`, run in the job process when an engine starts
and in each scheduler process) resets the root logger: `logging.basicConfig(level=WARNING, force=True)`,
or `logging.config.dictConfig` of the file `SGLANG_LOGGING_CONFIG_PATH` names, which disables every
logger it does not list. eyas's loggers therefore keep a handler of their own on the `eyas` logger
(`propagate=False`, so never through the root), and `keep_stage_logging()` re-asserts it after each
engine start. Spawned engine processes inherit `EYAS_STAGE_LOG` and call `child_stage_logging()`, so
their output (SGLang's batch lines, eyas's hooks) is appended to the same log file.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

STAGE_LOG_ENV = "EYAS_STAGE_LOG"  # "<stage name>\t<log path>", for the engine's spawned processes
_STAGE: dict[str, logging.Handler] = {}  # the stage's handler on the `eyas` logger


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

    def fileno(self):
        # The console's descriptor, as before the tee: SGLang's scheduler process calls
        # `faulthandler.enable()` on sys.stderr (sglang 0.5.17 `managers/scheduler.py`,
        # `configure_scheduler_process`), which needs one.
        return self.streams[0].fileno()


def _open_append(log_path: str | os.PathLike):
    # Append mode: the engine's processes append to the same file, and a write at the job process's own
    # offset would overwrite their lines.
    return open(log_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (lives for the job)


def _install(name: str) -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s eyas.{name} %(levelname)s %(message)s"))
    old = _STAGE.get("handler")
    if old is not None:
        logging.getLogger("eyas").removeHandler(old)
    _STAGE["handler"] = handler
    keep_stage_logging()
    return logging.getLogger(f"eyas.{name}")


def _slurm_restart() -> str | None:
    """'SLURM job J, restart N' when this run is SLURM's restart of a requeued job (preemption,
    `scontrol requeue`), else None. SLURM sets SLURM_RESTART_COUNT in a restarted batch job
    (https://slurm.schedmd.com/sbatch.html#OPT_SLURM_RESTART_COUNT), but Snakemake's SLURM job step
    passes on only the job's id to the rule's own `srun`, so the count is asked of `scontrol` then.
    The log of the run SLURM stopped is gone by then: Snakemake removes a job's log before it runs
    the job, and SLURM truncates the job's output file at a restart."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    count = os.environ.get("SLURM_RESTART_COUNT")
    if count is None and shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "-o", "show", "job", job_id],
                                 capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        count = next(iter(re.findall(r"\bRestarts=(\d+)", out)), None)
    if not count or not count.isdigit() or int(count) == 0:
        return None
    return f"SLURM job {job_id}, restart {count}"


def setup_stage_logging(log_path: str | os.PathLike | None, name: str) -> logging.Logger:
    """Tee stdout/stderr (progress bars included) into `log_path` and return the stage's logger.
    In SLURM's restart of a requeued job the log's first line says so.

    `kill -USR1 <pid>` writes every thread's Python stack into the log and the job goes on: where a
    slow or stuck stage spends its time, without a profiler on the machine."""
    if log_path:
        open(log_path, "w").close()  # a fresh log per run; then appended to (see _open_append)
        log_file = _open_append(log_path)
        if restart := _slurm_restart():  # Snakemake removed the log of the run SLURM stopped
            log_file.write(f"--- {restart}: SLURM requeued this job (preemption, `scontrol requeue`) ---\n")
        sys.stdout = _Tee(sys.__stdout__, log_file)
        sys.stderr = _Tee(sys.__stderr__, log_file)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=log_file, all_threads=True, chain=False)
        os.environ[STAGE_LOG_ENV] = f"{name}\t{os.path.abspath(log_path)}"
    # Other libraries' records (transformers' warnings) through the root, until an engine resets it.
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s eyas.{name} %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    return _install(name)


def keep_stage_logging() -> None:
    """Re-assert the stage's handler on the `eyas` logger (INFO, not propagated, none disabled): call it
    after anything that may reconfigure logging, e.g. an SGLang engine start."""
    handler = _STAGE.get("handler")
    if handler is None:
        return
    logger = logging.getLogger("eyas")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.disabled = False
    if handler not in logger.handlers:
        logger.addHandler(handler)
    for key, child in logging.Logger.manager.loggerDict.items():
        if key.startswith("eyas.") and isinstance(child, logging.Logger):
            child.disabled = False


def child_stage_logging() -> None:
    """In a process the stage's engine spawned: its stdout/stderr and eyas's records also go to the
    stage's log file (no-op outside a stage)."""
    value = os.environ.get(STAGE_LOG_ENV)
    if not value or _STAGE.get("handler") is not None:
        return
    name, log_path = value.split("\t", 1)
    log_file = _open_append(log_path)
    sys.stdout = _Tee(sys.__stdout__, log_file)
    sys.stderr = _Tee(sys.__stderr__, log_file)
    _install(f"{name}.{os.getpid()}")


class Progress:
    """`what: done / total unit (pct), rate/s, ~eta` on a logger, at most every `every` seconds and when
    done: a line a long GPU stage writes while it works (tqdm bars are rewritten in place, which a log
    file and a terminal that Snakemake multiplexes show poorly)."""

    def __init__(self, log: logging.Logger, what: str, total: int, unit: str, every: float = 30.0):
        self.log, self.what, self.total, self.unit, self.every = log, what, total, unit, every
        self.done, self.start = 0, time.perf_counter()
        self.last = self.start

    def update(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            seconds = max(now - self.start, 1e-9)
            rate = self.done / seconds
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            self.log.info(
                "%s: %d / %d %s (%.0f%%), %.1f %s/s, %.0f s so far, ~%.0f s left",
                self.what,
                self.done,
                self.total,
                self.unit,
                100 * self.done / max(self.total, 1),
                rate,
                self.unit,
                seconds,
                eta,
            )


@contextmanager
def heartbeat(log: logging.Logger, what: str, every: float = 60.0):
    """Log `what: running for N s` every `every` seconds while the block runs: a blocking call (one
    engine request holding a whole batch) then still shows that the stage is alive."""
    stop, start = threading.Event(), time.perf_counter()

    def beat():
        while not stop.wait(every):
            log.info("%s: running for %.0f s", what, time.perf_counter() - start)

    thread = threading.Thread(target=beat, name="eyas-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
