"""The generation engines of a job: one or several SGLang engines on the job's GPUs, started once and fed
every prompt the job generates from (regeneration's rounds of every split, or the prompts stage's
user turns and answers), so a job pays for one start-up, not one per split.

Why several: at a small target one engine's scheduler process, not the GPU, sets the rate (SmolLM2 on an
H200: the GPU was 14-25% busy while one engine regenerated), and SGLang's `dp_size` places each replica
on a GPU of its own (`gpu_id_step` >= 1, sglang 0.5.17 `server_args.py`). `GenerationEngines` starts
`count` engines, each with an equal share of the memory (`memory_shares`), one after the other or
(`together`) all at once with their GPU work in turns (`eyas.engine.start_turns`: the imports overlap,
the memory is measured as one after the other), all on the first engine's event loop, and deals each
call's prompts among them, prompt i to engine i mod count: their `async_generate` calls run together on
that loop in the job's main thread (the engines' schedulers are processes of their own).
One engine is called exactly as before.

An engine process that dies while several engines work: SGLang's watchdog sends the job SIGQUIT, whose
handler (the last engine's: they share the loop) kills every engine process and stops the loop; the
call then raises `EngineDied` naming the stage and every dead process, read from the engines' own
`SubprocessWatchdog`s.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import tempfile
import threading
import time

from eyas.engine.sglang import (
    SOME_PROCESS,
    EngineDied,
    dead_processes,
    death_message,
    start_engine,
)
from eyas.engine.sglang_args import base_engine_args, generation_engine_args, user_engine_args
from eyas.engine.sglang_models import only_needed_models
from eyas.engine.start_turns import StartTurn

log = logging.getLogger("eyas.generation")


def memory_shares(fraction: float, count: int) -> list[float]:
    """Each engine's `mem_fraction_static` so that `count` engines started one after another share
    `fraction` of the GPU memory equally. SGLang 0.5.17 sizes an engine's static memory as its
    `mem_fraction_static` of the memory free when *that* engine starts
    (`kv_cache_configurator._profile_available_bytes`), so one fraction for all would give the first
    engine half, the next a quarter, ... at 0.5; engine i starts with 1 - i * fraction / count free."""
    share = fraction / count
    return [share / (1 - index * share) for index in range(count)]


def distinct_ports(count: int, user_port: int | None = None) -> list[int]:
    """A port for each of `count` engines' torch.distributed rendezvous (SGLang's `nccl_port`), all
    different: `user_port` + i where the user set one, else ports the OS gives while all `count` are
    held at once. Left to themselves, engines started together in one process each ask SGLang's
    `get_free_port()` (bind to port 0, close, return the port; sglang 0.5.17 `srt/server_args.py`
    `PortArgs.init_new`), which may hand two of them the same just-closed port: one scheduler then
    died with EADDRINUSE (H100, 2026-12-06)."""
    if user_port is not None:
        return [user_port + index for index in range(count)]
    held = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def engines_args(args: dict, count: int) -> list[dict]:
    """Each of `count` engines' SGLang args: `args` with the engine's memory share and, for several,
    its own rendezvous port (`distinct_ports`)."""
    shares = memory_shares(args["mem_fraction_static"], count)
    if count == 1:
        return [args | {"mem_fraction_static": shares[0]}]
    ports = distinct_ports(count, args.get("nccl_port"))
    return [args | {"mem_fraction_static": s, "nccl_port": p} for s, p in zip(shares, ports, strict=True)]


def _sigquit_while_starting_together(signum=None, frame=None) -> None:
    log.warning("an engine process failed as the engines started: its engine's start reports it")


def deal(prompts: list, count: int) -> list[list[int]]:
    """Indices of `prompts` per engine: prompt i to engine i mod count (equal counts, mixed lengths)."""
    return [list(range(e, len(prompts), count)) for e in range(count)]


def generation_args(engine_settings, generation, *, model_dir, seed: int, trust_remote_code: bool) -> dict:
    """Each generation engine's SGLang args: the `sglang` section (`engine_settings`) builds it,
    `generation` (`regenerate.engine`) sizes its admission and CUDA graphs."""
    base = base_engine_args(engine_settings, model_dir, "bfloat16", trust_remote_code)
    base |= user_engine_args(engine_settings.engine_args, None)
    return generation_engine_args(base, seed, generation)


def generation_engines(
    engine_settings, generation, *, model_dir, seed: int, trust_remote_code: bool, stage: str
) -> GenerationEngines:
    """A job's generation engines as every generating stage builds them (`generation_args`), as many
    and started as `generation` (`regenerate.engine`) says; `stage` names them in logs and errors."""
    args = generation_args(
        engine_settings, generation, model_dir=model_dir, seed=seed, trust_remote_code=trust_remote_code
    )
    return GenerationEngines(args, count=generation.engines, stage=stage, together=generation.start_together)


class GenerationEngines:
    """`count` engines of `args` (one `EyasEngine` each), called as one engine: `generate(input_ids=...,
    sampling_params=...)`. A context manager: the engines stop on exit."""

    def __init__(self, args: dict, *, count: int, stage: str, start=start_engine, together: bool = False):
        if count < 1:
            raise ValueError(f"regenerate.engine.engines: {count} must be >= 1")
        self.stage, self.engines = stage, []
        self._release, self._starters = threading.Event(), []  # `_start_together`'s threads
        each = engines_args(args, count)
        try:
            if together and count > 1:
                self._start_together(each, start)
            else:
                self._start_in_turn(each, start)
        except BaseException:
            self.shutdown()
            raise

    def _start_in_turn(self, each: list[dict], start) -> None:
        """One engine after the other (`each`: their args), each on the first engine's loop."""
        for index, engine_args in enumerate(each):
            began = time.perf_counter()
            loop = self.engines[0].loop if self.engines else None
            self.engines.append(start(engine_args, speculative=False, stage=self.stage, loop=loop))
            log.info("%s: engine %d / %d started in %.1f s", self.stage, index + 1, len(each),
                     time.perf_counter() - began)  # fmt: skip

    def _start_together(self, each: list[dict], start) -> None:
        """Every engine's processes at once, each engine's GPU work in its turn
        (`eyas.engine.start_turns`): a thread per engine starts it, and the engines are then attached
        to the first one's loop here, in the main thread. A scheduler that fails as it starts sends
        the job SIGQUIT; SGLang installs no handler for an engine started outside the main thread, and
        none is needed: that engine's thread sees its scheduler gone and fails its start (`EngineDied`),
        stopping every engine's processes, so the others' starts fail too.

        Each starter thread then stays alive until `shutdown`: SGLang's schedulers and detokenizers ask
        Linux to SIGKILL them when their parent dies (`kill_itself_when_parent_died`, sglang
        `srt/utils/common.py`), and for Linux that parent is the thread that started them (prctl(2),
        PR_SET_PDEATHSIG). Ended starter threads killed all four engines as they began to generate
        (H100, 2026-12-05)."""
        began = time.perf_counter()
        signal.signal(signal.SIGQUIT, _sigquit_while_starting_together)
        outcomes: list = [None] * len(each)  # an engine or the error of its start
        failures: list[int] = []  # engines whose start failed, first first: the others' may follow it
        started = [threading.Event() for _ in each]

        def starter(index: int, engine_args: dict, turn: StartTurn) -> None:
            try:
                outcomes[index] = start(
                    engine_args, speculative=False, stage=self.stage, turn=turn, attach=False
                )
            except BaseException as err:  # raised in the main thread below
                outcomes[index] = err
                failures.append(index)
                return
            finally:
                started[index].set()
            self._release.wait()  # the engine's processes live as long as this thread

        # one model-module scan for all (each thread's own would set and restore the variable in turn)
        with (
            only_needed_models([each[0]["model_path"]]),
            tempfile.TemporaryDirectory(prefix="eyas-turns-") as folder,
        ):
            for index, engine_args in enumerate(each):
                thread = threading.Thread(
                    target=starter, args=(index, engine_args, StartTurn(folder, index)),
                    name=f"engine-start-{index}", daemon=True,
                )  # fmt: skip
                thread.start()
                self._starters.append(thread)
            for event in started:
                event.wait()
        self.engines = [o for o in outcomes if not isinstance(o, BaseException)]  # stopped if one failed
        for index in failures[1:]:  # the first to fail is raised: the cause, where the rest may be victims
            log.error("%s: engine %d / %d did not start either: %s", self.stage, index + 1, len(each),
                      outcomes[index])  # fmt: skip
        if failures:
            raise outcomes[failures[0]]
        for engine in self.engines:
            engine.attach(self.engines[0].loop)
        log.info("%s: %d engines started together in %.1f s", self.stage, len(each),
                 time.perf_counter() - began)  # fmt: skip

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self.engines = []
        self._release.set()  # the starter threads of engines started together end after their engines
        for thread in self._starters:
            thread.join()
        self._starters = []

    def generate(self, *, input_ids: list[list[int]], sampling_params: dict) -> list[dict]:
        """`Engine.generate`'s batch call over every engine: one output dict per prompt, in order."""
        if not input_ids:
            return []
        if len(self.engines) == 1:
            return self.engines[0].generate(input_ids=input_ids, sampling_params=sampling_params)
        shares = [(engine, share) for engine, share in zip(self.engines, deal(input_ids, len(self.engines)),
                                                           strict=True) if share]  # fmt: skip
        calls = [
            engine.async_generate(input_ids=[input_ids[i] for i in share], sampling_params=sampling_params)
            for engine, share in shares
        ]
        outputs = self.run(asyncio.gather(*calls))
        results: list[dict] = [{} for _ in input_ids]
        for (_, share), outs in zip(shares, outputs, strict=True):
            for i, out in zip(share, outs, strict=True):
                results[i] = out
        return results

    async def generate_one(self, number: int, *, input_ids: list[int], sampling_params: dict) -> dict:
        """One prompt's `async_generate` on engine `number` mod count (a caller's stream n keeps its
        engine); awaited under `run`."""
        engine = self.engines[number % len(self.engines)]
        return await engine.async_generate(input_ids=input_ids, sampling_params=sampling_params)

    def run(self, calls):
        """Await `calls` (`async_generate`s or `generate_one`s) on the engines' one loop; an engine
        process that died fails them all with `EngineDied` naming every dead process (SGLang's SIGQUIT
        handler, the last engine's, stops the loop and kills the engines' processes)."""
        loop = self.engines[0].loop
        try:
            return loop.run_until_complete(calls)
        except BaseException as err:
            if len(self.engines) == 1 and self.engines[0].died:
                # one engine's own handler named what died before it stopped the engine's other processes
                raise EngineDied(self.engines[0].died) from err
            dead = [p for engine in self.engines for p in dead_processes(engine)]
            if dead or any(getattr(e, "died", None) for e in self.engines):
                what = ", ".join(dead) or SOME_PROCESS
                died = death_message(self.stage, f"{what} exited while the engine was in use")
                for engine in self.engines:
                    engine.died = engine.died or died
                raise EngineDied(died) from err
            raise
