"""Engines started together (`regenerate.engine.start_together`): every scheduler process starts at once,
and its GPU work waits for its turn (`eyas.engine.start_turns`); `GenerationEngines` starts them from
threads, gives each its turn and share of the memory, and attaches them to one loop in the main thread.
The real `Engine` front end started so is tested in tests/sglang/test_generation_engines.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from eyas.engine.generation import GenerationEngines, distinct_ports, memory_shares
from eyas.engine.start_turns import ReadyPipe, StartTurn, in_turn

SPAWN = mp.get_context("spawn")  # as SGLang starts its scheduler processes


def _scheduler(log: str, name: str, pipe_writer, hold: float) -> None:
    """A scheduler's stand-in: its 'GPU work' (held `hold` s) logged as begin/end, then the ready info."""
    with open(log, "a") as fh:
        fh.write(f"begin {name}\n")
    time.sleep(hold)
    with open(log, "a") as fh:
        fh.write(f"end {name}\n")
    pipe_writer.send({"status": "ready", "name": name})


def _start(folder: Path, log: Path, index: int, hold: float):
    reader, writer = SPAWN.Pipe(duplex=False)
    turn = StartTurn(str(folder), index)
    proc = SPAWN.Process(target=in_turn, args=(turn, _scheduler, str(log), f"engine{index}", writer, hold))
    proc.start()
    return proc, reader


def test_schedulers_started_at_once_do_their_gpu_work_one_after_another(tmp_path):
    log = tmp_path / "log"
    # started last first, so any order but the turns' would show
    started = [_start(tmp_path, log, index, hold=0.3) for index in (2, 1, 0)]
    infos = [reader.recv() for _, reader in started]
    for proc, _ in started:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert sorted(info["name"] for info in infos) == ["engine0", "engine1", "engine2"]
    lines = log.read_text().split()
    assert lines == ["begin", "engine0", "end", "engine0", "begin", "engine1", "end", "engine1",
                     "begin", "engine2", "end", "engine2"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.glob("ready-*")) == ["ready-0", "ready-1", "ready-2"]


def test_a_turn_ends_before_its_message_reaches_the_job(tmp_path):
    # the job removes the turn folder once it has every engine's message: the marker must be there first
    turn, seen = StartTurn(str(tmp_path), 0), []

    class Pipe:
        def send(self, message):
            seen.append(turn.marker(0).exists())

    ReadyPipe(Pipe(), turn).send({"status": "ready"})
    assert seen == [True]


def test_a_turn_ends_at_the_first_message_on_the_ready_pipe(tmp_path):
    reader, writer = SPAWN.Pipe(duplex=False)
    turn = StartTurn(str(tmp_path), 0)
    pipe = ReadyPipe(writer, turn)
    assert not turn.marker(0).exists()
    pipe.send({"status": "failed"})  # a failure status ends it as the ready info does
    assert turn.marker(0).exists() and reader.recv() == {"status": "failed"}
    assert pipe.closed is False  # the rest is the pipe's own


def test_in_turn_needs_exactly_one_ready_pipe(tmp_path):
    with pytest.raises(TypeError, match="expected one ready pipe among the scheduler's arguments, found 0"):
        in_turn(StartTurn(str(tmp_path), 0), print, "no pipe")


def _orphan_parent(folder: str, pid_file: str) -> None:
    """A job that starts engine 1's scheduler (whose turn never comes) and is then gone."""
    reader, writer = SPAWN.Pipe(duplex=False)
    proc = SPAWN.Process(target=in_turn, args=(StartTurn(folder, 1), _scheduler, os.devnull, "e1", writer, 0))
    proc.start()
    Path(pid_file).write_text(str(proc.pid))
    os._exit(0)  # killed: no cleanup of its children


def _alive(process) -> bool:
    """Running (an exited process whose new parent has not reaped it yet is a zombie)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_waiting_scheduler_exits_when_its_job_is_gone(tmp_path):
    pid_file = tmp_path / "pid"
    job = SPAWN.Process(target=_orphan_parent, args=(str(tmp_path), str(pid_file)))
    job.start()
    job.join(timeout=60)
    scheduler = psutil.Process(int(pid_file.read_text()))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(scheduler):
        time.sleep(0.1)
    if _alive(scheduler):
        scheduler.kill()
        pytest.fail("the orphaned scheduler kept waiting for its turn")
    assert not (tmp_path / "ready-1").exists()


class FakeEngine:
    def __init__(self, args: dict, turn: StartTurn):
        self.args, self.turn, self.loop = args, turn, object()
        self.attached_to, self.stopped = None, False
        self.thread = threading.current_thread()

    def attach(self, loop=None) -> None:
        self.attached_to = (loop, threading.current_thread())

    def shutdown(self) -> None:
        self.stopped = True


@pytest.fixture()
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return str(tmp_path)


def test_engines_started_together_take_their_turns_shares_and_one_loop(model_dir):
    started = []

    def start(args, *, speculative, stage, turn, attach, **_):
        assert not speculative and not attach and stage == "test"
        engine = FakeEngine(args, turn)
        started.append(engine)
        return engine

    args = {"mem_fraction_static": 0.5, "model_path": model_dir}
    engines = GenerationEngines(args, count=4, stage="test", start=start, together=True)
    by_turn = sorted(engines.engines, key=lambda e: e.turn.index)
    assert engines.engines == by_turn and [e.turn.index for e in by_turn] == [0, 1, 2, 3]
    assert [e.args["mem_fraction_static"] for e in by_turn] == memory_shares(0.5, 4)
    assert len({e.turn.folder for e in by_turn}) == 1 and not Path(by_turn[0].turn.folder).exists()
    main = threading.main_thread()
    assert all(e.thread is not main for e in by_turn)  # started from threads ...
    assert all(e.attached_to == (by_turn[0].loop, main) for e in by_turn)  # ... attached in the main one


def test_one_engine_failing_to_start_together_stops_the_others(model_dir):
    engines = []

    def start(args, *, turn, **_):
        if turn.index == 1:
            raise RuntimeError("engine 1 did not start")
        engines.append(FakeEngine(args, turn))
        return engines[-1]

    args = {"mem_fraction_static": 0.5, "model_path": model_dir}
    with pytest.raises(RuntimeError, match="engine 1 did not start"):
        GenerationEngines(args, count=3, stage="test", start=start, together=True)
    assert len(engines) == 2 and all(e.stopped for e in engines)
    assert all(e.attached_to is None for e in engines)


def test_one_engine_is_started_as_before_when_together(model_dir):
    calls = []

    def start(args, **kwargs):
        calls.append(kwargs)
        return FakeEngine(args, None)

    GenerationEngines({"mem_fraction_static": 0.5, "model_path": model_dir}, count=1, stage="t", start=start,
                      together=True)  # fmt: skip
    assert calls == [{"speculative": False, "stage": "t", "loop": None}]


def test_engines_started_together_keep_their_starter_threads_until_shutdown(model_dir):
    """SGLang's engine processes die with the thread that started them (PR_SET_PDEATHSIG): a starter
    thread must live as long as its engine."""
    args = {"mem_fraction_static": 0.5, "model_path": model_dir}
    engines = GenerationEngines(args, count=3, stage="t", start=lambda a, *, turn, **_: FakeEngine(a, turn),
                                together=True)  # fmt: skip
    started = list(engines.engines)
    threads = [e.thread for e in started]
    time.sleep(0.2)
    assert all(t.is_alive() for t in threads)
    engines.shutdown()
    assert all(e.stopped for e in started) and not any(t.is_alive() for t in threads)


def test_the_first_engine_to_fail_is_the_error_raised(model_dir):
    """One engine's failure makes the others' starts fail after it (victims): the cause is raised."""
    cause = threading.Event()

    def start(args, *, turn, **_):
        if turn.index == 2:
            cause.set()
            raise RuntimeError("engine 2: out of memory")
        cause.wait(5)
        time.sleep(0.1)
        raise RuntimeError(f"engine {turn.index}: stopped")

    args = {"mem_fraction_static": 0.5, "model_path": model_dir}
    with pytest.raises(RuntimeError, match="engine 2: out of memory"):
        GenerationEngines(args, count=3, stage="t", start=start, together=True)


@pytest.mark.parametrize("together", [True, False])
def test_several_engines_get_distinct_rendezvous_ports(model_dir, together):
    """Engines started in one process each chose a free port for torch.distributed's rendezvous
    themselves, and two could get the same one (EADDRINUSE, H100): the job hands each its own."""
    args = {"mem_fraction_static": 0.5, "model_path": model_dir}
    start = lambda a, *, turn=None, **_: FakeEngine(a, turn)  # noqa: E731
    engines = GenerationEngines(args, count=4, stage="t", start=start, together=together)
    ports = [e.args["nccl_port"] for e in engines.engines]
    assert len(set(ports)) == 4 and all(0 < p < 65536 for p in ports)
    engines.shutdown()
    user = GenerationEngines(args | {"nccl_port": 29600}, count=3, stage="t", start=start, together=together)
    assert sorted(e.args["nccl_port"] for e in user.engines) == [29600, 29601, 29602]
    user.shutdown()
    one = GenerationEngines(args, count=1, stage="t", start=start, together=together)
    assert "nccl_port" not in one.engines[0].args  # one engine: SGLang's own choice, as before


def test_distinct_ports_are_free_and_different():
    ports = distinct_ports(16)
    assert len(set(ports)) == 16
    for port in ports:  # closed again: each can be bound (what the engine's rendezvous will do)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
