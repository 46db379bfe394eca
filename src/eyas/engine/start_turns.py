"""Several SGLang engines of one job started together, their GPU work one engine after the other.

An engine's start is mostly its scheduler process importing SGLang (~29 s of a ~37 s warm start on an
H100, bench/results/engine-start-h100-smollm2.json); four engines started one after another paid it
four times over (141 s in the cut recipe). Started together, the imports overlap. Their GPU work must
not: SGLang sizes an engine's memory by what is free when that engine measures it
(`kv_cache_configurator._profile_available_bytes`, sglang 0.5.17), so engines measuring at once would
all count the same free memory. So each scheduler process, once SGLang is imported (spawn unpickles its
process function, which imports `sglang.srt.managers.scheduler`), waits for its `StartTurn`: until the
engine before it is ready. Engine i then measures with engines 0..i-1 in place, exactly as when they
start one after another, and `eyas.engine.generation.memory_shares` holds.

A scheduler's turn ends when it sends its first message on the ready pipe (SGLang's `ready` info, or
its failure status): `ReadyPipe` marks the turn done with a file in the job's turn folder, then forwards
it. A scheduler that dies before that ends no turn; the engine's start fails in the job, which then
stops every engine's processes, the waiting ones included. A waiting scheduler whose job process is
gone (killed) exits instead of waiting for ever.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

POLL_SECONDS = 0.05


@dataclass(frozen=True)
class StartTurn:
    """Engine `index` of engines started together; `folder` is the job's turn folder. Made in the job
    process, which spawns the engine's scheduler (spawn pickles the turn to it)."""

    folder: str
    index: int
    job_pid: int = field(default_factory=os.getpid)  # made in the job process: its scheduler's parent

    def marker(self, index: int) -> Path:
        return Path(self.folder) / f"ready-{index}"

    def wait(self) -> None:
        """Until engine index - 1 is ready (engine 0 goes at once); exit if the job process is gone."""
        if self.index == 0:
            return
        while not self.marker(self.index - 1).exists():
            if os.getppid() != self.job_pid:
                raise SystemExit(f"engine {self.index}: the job process that started it is gone")
            time.sleep(POLL_SECONDS)

    def done(self) -> None:
        """This engine's turn is over: the next one may measure the GPU's memory."""
        self.marker(self.index).touch()


class ReadyPipe:
    """A scheduler's ready pipe (the `pipe_writer` SGLang hands it) whose first `send` also ends the
    engine's turn; everything else is the pipe's own."""

    def __init__(self, pipe: Connection, turn: StartTurn):
        self._pipe, self._turn, self._sent = pipe, turn, False

    def send(self, message) -> None:
        # The turn ends before the message goes: once the job has every engine's message it removes
        # the turn folder, so a marker written after the last one could find no folder.
        if not self._sent:
            self._sent = True
            self._turn.done()
        self._pipe.send(message)

    def __getattr__(self, name):
        return getattr(self._pipe, name)


def in_turn(turn: StartTurn, process_func, *args, **kwargs):
    """Run a scheduler process function in its turn: wait for it, and end it when the scheduler reports
    on its ready pipe (found by type: it is positional in sglang 0.5.17 and 0.5.23, at different places)."""
    pipes = [i for i, arg in enumerate(args) if isinstance(arg, Connection)]
    keys = [k for k, arg in kwargs.items() if isinstance(arg, Connection)]
    if len(pipes) + len(keys) != 1:
        found = len(pipes) + len(keys)
        raise TypeError(f"in_turn: expected one ready pipe among the scheduler's arguments, found {found}")
    args = list(args)
    if pipes:
        args[pipes[0]] = ReadyPipe(args[pipes[0]], turn)
    else:
        kwargs[keys[0]] = ReadyPipe(kwargs[keys[0]], turn)
    turn.wait()
    return process_func(*args, **kwargs)
