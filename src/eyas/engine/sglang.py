"""The SGLang engines of regeneration and served evaluation, in the job process.

sglang is imported lazily, inside functions, here and in a few modules beside it (the engines'
arguments, `engine/sglang_args.py`; the drafter select in the scheduler, `engine/sglang_draft_swap.py`;
the extract stage's capture engine and hook; tests/test_layers.py lists them). Nothing in SGLang's
files is edited: eyas starts stock engines and hooks them from outside.

Regeneration's and served evaluation's engines (`start_engine`) are `EyasEngine`s: when one of its
processes dies, the engine's start or the call in flight raises `EngineDied` naming the stage, instead
of SGLang killing the job process (`_death_handler_class`); the stage's `finally` blocks run, and as
its outputs are written atomically once the engine's work is done, nothing that looks finished is left.
The served one is a `DraftSwapEngine`: `select(dir, k)` serves another drafter at another k in place
(`eyas.engine.sglang_draft_swap`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading

from eyas.core.logs import child_stage_logging, keep_stage_logging
from eyas.engine import sglang_draft_swap
from eyas.engine.sglang_args import check_tested, server_arg_names
from eyas.engine.sglang_models import only_needed_models
from eyas.engine.start_turns import StartTurn, in_turn

log = logging.getLogger("eyas.sglang")


def in_stage_log(process_func, *args, **kwargs):
    """An engine process function (scheduler, detokenizer) run with its output in the stage's log
    file too (`eyas.core.logs.child_stage_logging`); picklable, as spawn needs, as a partial."""
    child_stage_logging()
    return process_func(*args, **kwargs)


class EngineDied(RuntimeError):
    """An SGLang engine process (a scheduler, the detokenizer) died while a stage was using the engine."""


def dead_processes(engine) -> list[str]:
    """'scheduler_0 (pid 123, exit code -9)' for each process of `engine` (an SGLang engine, or its
    `SubprocessWatchdog` itself) that exited with an error, read from the watchdog (its `_processes` and
    `_names`: `srt/utils/watchdog.py` of 0.5.17 and 0.5.23), which watches every scheduler and
    detokenizer process; [] while all live (or where the engine keeps no watchdog)."""
    watchdog = getattr(getattr(engine, "tokenizer_manager", None), "_subprocess_watchdog", engine)
    procs = list(getattr(watchdog, "_processes", None) or [])
    names = list(getattr(watchdog, "_names", None) or [f"process_{i}" for i in range(len(procs))])
    return [
        f"{name} (pid {proc.pid}, exit code {proc.exitcode})"
        for proc, name in zip(procs, names, strict=False)
        if not proc.is_alive() and proc.exitcode not in (0, None)
    ]


SOME_PROCESS = "an engine process (its error is logged above)"  # where the watchdog names none


def death_message(stage: str, what: str) -> str:
    """The error of a stage whose engine died: `what` happened, what the job did, what to do."""
    return (
        f"{stage}: the SGLang engine died: {what} (eyas stopped the engine's other processes). The job "
        "stops here without writing its outputs. Rerun it: Snakemake reruns a job whose outputs are "
        "missing. If it dies again, the lines above say why (out of GPU memory, a crash in a kernel or "
        "in NCCL)."
    )


def _death_handler_class():
    """SGLang's SIGQUIT handler of a running engine, except that the job process lives on.

    When an engine process dies, SGLang's `SubprocessWatchdog` (a thread of the job process; sglang
    0.5.17 and 0.5.23 `srt/utils/watchdog.py`) sends SIGQUIT to the job process, and the tokenizer
    manager's `SignalHandler.running_phase_sigquit_handler` (`srt/managers/tokenizer_manager.py`) calls
    `kill_process_tree(os.getpid())`: it SIGKILLs the engine's processes and then the job process
    itself. A job killed so runs no `finally` and says nothing of why. Here the engine's processes are
    killed as SGLang kills them (GPU memory freed), the job process is spared, the engine is marked
    dead and its event loop stopped, so the engine call in flight fails and `EyasEngine` raises
    `EngineDied`, naming the stage and the process that died."""
    from sglang.srt.managers.tokenizer_manager import SignalHandler
    from sglang.srt.utils.common import kill_process_tree

    class EngineDeathHandler(SignalHandler):
        def __init__(self, tokenizer_manager, engine=None):
            super().__init__(tokenizer_manager)
            self.engine = engine

        def running_phase_sigquit_handler(self, signum=None, frame=None):
            manager = self.tokenizer_manager
            watchdog = manager._subprocess_watchdog
            dead = ", ".join(dead_processes(watchdog)) or SOME_PROCESS
            what = f"{dead} exited while the engine was in use (SGLang's watchdog noticed)"
            self.engine.died = death_message(self.engine.stage, what)
            log.error(self.engine.died)
            try:
                if watchdog is not None:
                    watchdog.stop()
                manager.dump_requests_before_crash()  # SGLang's crash dump, where one is configured
                kill_process_tree(os.getpid(), include_parent=False)
            finally:
                asyncio.get_running_loop().stop()  # the call waiting on the dead engine returns

    return EngineDeathHandler


async def _create_handle_loop(tokenizer_manager) -> None:
    tokenizer_manager.auto_create_handle_loop()


def _sigquit_while_starting(stage: str, signum=None, frame=None) -> None:
    """The engine's `custom_sigquit_handler` (a ServerArgs field SGLang installs instead of its
    start-up handler, which kills the job process: `_set_envs_and_config`, `entrypoints/engine.py` of
    0.5.17 and 0.5.23). An engine process that fails as the engine starts sends the job process
    SIGQUIT (`run_scheduler_process`'s `except`); this raises `EngineDied` from the start instead.
    Module-level (bound by `functools.partial`): spawn pickles the ServerArgs to the engine processes."""
    raise EngineDied(
        death_message(stage, "an engine process failed as the engine started (its error is above)")
    )


# The job-process part of an engine's start, but for its wait for the schedulers, runs under this lock:
# engines started together from threads (`eyas.engine.generation`) would otherwise race on what SGLang
# keeps process-wide (0.5.23 publishes each engine's ServerArgs as it starts and its tokenizer manager
# checks the published one: `runtime_context.publish`). Their schedulers start and load meanwhile.
_LAUNCH = threading.Lock()


def _outside_launch_lock(wait_for_ready):
    """An engine's wait for its schedulers, run with `_LAUNCH` released."""

    def wait():
        _LAUNCH.release()
        try:
            return wait_for_ready()
        finally:
            _LAUNCH.acquire()

    return wait


def engine_class():
    """`sglang.Engine` that raises `EngineDied` when one of its processes dies as it starts or later,
    during a call."""
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.utils.common import kill_process_tree

    handler = _death_handler_class()

    class EyasEngine(Engine):
        def __init__(
            self, *, stage: str, loop=None, turn: StartTurn | None = None, attach: bool = True, **kwargs
        ):
            self.stage, self.died = stage, None
            # SGLang launches its processes with these (`Engine._launch_subprocesses`; a release
            # without one of them launches that process its own way, outside the stage's log).
            for name in ("run_scheduler_process_func", "run_detokenizer_process_func"):
                if hasattr(self, name):
                    func = getattr(self, name)
                    if turn is not None and name == "run_scheduler_process_func":
                        func = functools.partial(in_turn, turn, func)  # GPU work in its turn
                    setattr(self, name, functools.partial(in_stage_log, func))
            quit_handler = functools.partial(_sigquit_while_starting, stage)
            try:
                with _LAUNCH:
                    super().__init__(**kwargs, custom_sigquit_handler=quit_handler)
            except EngineDied:
                kill_process_tree(os.getpid(), include_parent=False)
                raise
            except RuntimeError as err:
                # What SGLang raises when a scheduler dies before it is ready (`_wait_for_scheduler_ready`,
                # `entrypoints/engine.py` of 0.5.17 and 0.5.23); the engine's other processes would live
                # until the job exits (its atexit shutdown).
                kill_process_tree(os.getpid(), include_parent=False)
                raise EngineDied(death_message(stage, f"it did not start: {err}")) from err
            keep_stage_logging()  # SGLang's configure_logger reset the root logger as it started
            if attach:
                self.attach(loop)

        @classmethod
        def _launch_scheduler_processes(cls, *args, **kwargs):
            # SGLang's hook for other launchers (Ray): the same launch, its wait outside `_LAUNCH`
            result, processes = super()._launch_scheduler_processes(*args, **kwargs)
            result.wait_for_ready = _outside_launch_lock(result.wait_for_ready)
            return result, processes

        def attach(self, loop=None) -> None:
            """Ready the engine for calls on `loop` (default its own), in the job's main thread: an
            engine started in another thread (`attach=False`) is attached once it has started."""
            if loop is not None:
                # Several engines of one job share one event loop, so their calls can run together
                # (`eyas.engine.generation`): sglang 0.5.17 makes each engine a new loop, 0.5.23 reuses
                # the thread's (`Engine._ensure_event_loop`).
                self.loop = loop
                asyncio.set_event_loop(loop)
            manager = self.tokenizer_manager
            manager.signal_handler_class = functools.partial(handler, engine=self)
            # SGLang installs the tokenizer manager's SIGQUIT handler at its first request; until
            # then the start-up one is in place. Installed now, a death before the first request
            # (while the stage prepares its prompts) stops the next call too.
            self.loop.run_until_complete(_create_handle_loop(manager))

        def call(self, function, *args, **kwargs):
            """`function(*args, **kwargs)`, raising `EngineDied` when the engine is or becomes dead (a
            request to a dead scheduler would otherwise wait for ever)."""
            if self.died:
                raise EngineDied(self.died)
            try:
                return function(*args, **kwargs)
            except BaseException as err:
                if self.died:
                    raise EngineDied(self.died) from err
                raise

        def generate(self, *args, **kwargs):
            return self.call(super().generate, *args, **kwargs)

    return EyasEngine


def draft_swap_engine_class():
    """An `EyasEngine` whose scheduler processes accept `select` (drafter and k)."""

    class DraftSwapEngine(engine_class()):
        run_scheduler_process_func = staticmethod(sglang_draft_swap.draft_swap_scheduler_process)

        def select(self, draft_dir: str | os.PathLike, k: int) -> None:
            """Serve the drafter at `draft_dir` (weights loaded in place) drafting k tokens a pass."""
            from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

            path = os.fspath(draft_dir)
            if not sglang_draft_swap.is_eagle3_draft_dir(path):
                archs = sglang_draft_swap.EAGLE3_DRAFT_ARCHS
                raise ValueError(f"{path}/config.json: not an EAGLE-3 drafter export {archs}")
            steps = f"{sglang_draft_swap.STEPS_PREFIX}{k}"
            request = UpdateWeightFromDiskReqInput(model_path=path, weight_version=steps)
            result = self.call(
                lambda: self.loop.run_until_complete(
                    self.tokenizer_manager.update_weights_from_disk(request, None)
                )
            )
            if not result[0]:
                raise RuntimeError(f"SGLang did not serve the drafter {path} at k={k}: {result[1]}")

    return DraftSwapEngine


def start_engine(
    args: dict,
    *,
    speculative: bool,
    stage: str,
    loop=None,
    turn: StartTurn | None = None,
    attach: bool = True,
):
    """A running engine for `args` (checked against the installed ServerArgs first); `stage` names
    the job in the error raised when the engine dies; `loop`: the event loop it runs its calls on (by
    default its own). Engines started together from threads (`eyas.engine.generation`) each take a
    `turn` (`eyas.engine.start_turns`) and `attach=False`: they are attached in the main thread."""
    import sglang

    check_tested(sglang.__version__, "sglang engine")
    unknown = set(args) - server_arg_names()
    if unknown:
        raise ValueError(
            f"engine args {sorted(unknown)} are not ServerArgs fields of sglang {sglang.__version__}"
        )
    cls = draft_swap_engine_class() if speculative else engine_class()
    models = [args["model_path"], *filter(None, [args.get("speculative_draft_model_path")])]
    drafters = sglang_draft_swap.EAGLE3_DRAFT_ARCHS if speculative else ()  # select may swap either
    with only_needed_models(models, drafters):
        return cls(stage=stage, loop=loop, turn=turn, attach=attach, **args)
