"""The generation engines of a job: one or several SGLang engines on the job's GPUs, started once and fed
every prompt the job generates from (regeneration's rounds of every split; later the target-written
prompts too), so a job pays for one start-up, not one per split or stage.

Why several: at a small target one engine's scheduler process, not the GPU, sets the rate (SmolLM2 on an
H200: the GPU was 14-25% busy while one engine regenerated), and SGLang's `dp_size` places each replica
on a GPU of its own (`gpu_id_step` >= 1, sglang 0.5.17 `server_args.py`). `GenerationEngines` starts
`count` engines one after the other (each sizes its memory from what is still free when it starts:
`kv_cache_configurator._profile_available_bytes` of 0.5.17) and deals each call's prompts among them,
prompt i to engine i mod count; each engine's blocking `generate` runs in a thread of its own (its
event loop is its own: `Engine.__init__` makes a new loop when none runs). One engine is called on the
job's main thread, exactly as before.

An engine process that dies while several engines work is found by polling the engines' own
`SubprocessWatchdog` process lists (SGLang's SIGQUIT reaches only the loop that installed its handler
last); every engine process is then killed and `EngineDied` is raised, naming the stage.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time

from eyas.engine.sglang import EngineDied, death_message, start_engine

log = logging.getLogger("eyas.generation")

POLL_S = 1.0  # how often the job checks the engines' processes while several engines work


def deal(prompts: list, count: int) -> list[list[int]]:
    """Indices of `prompts` per engine: prompt i to engine i mod count (equal counts, mixed lengths)."""
    return [list(range(e, len(prompts), count)) for e in range(count)]


def dead_processes(engine) -> list[str]:
    """'scheduler_0 (pid 123, exit code -9)' for each process of `engine` that exited with an error,
    from SGLang's `SubprocessWatchdog` (`_processes`, `_names`: `srt/utils/watchdog.py` of 0.5.17 and
    0.5.23); [] while all live (or when the engine keeps no watchdog)."""
    watchdog = getattr(getattr(engine, "tokenizer_manager", None), "_subprocess_watchdog", None)
    procs = list(getattr(watchdog, "_processes", None) or [])
    names = list(getattr(watchdog, "_names", None) or [f"process_{i}" for i in range(len(procs))])
    return [
        f"{name} (pid {proc.pid}, exit code {proc.exitcode})"
        for proc, name in zip(procs, names, strict=False)
        if not proc.is_alive() and proc.exitcode not in (0, None)
    ]


class GenerationEngines:
    """`count` engines of `args` (one `EyasEngine` each), called as one engine: `generate(input_ids=...,
    sampling_params=...)`. A context manager: the engines stop on exit."""

    def __init__(self, args: dict, *, count: int, stage: str, start=start_engine):
        if count < 1:
            raise ValueError(f"regenerate.engine.engines: {count} must be >= 1")
        self.stage, self.engines = stage, []
        try:
            for index in range(count):
                began = time.perf_counter()
                self.engines.append(start(args, speculative=False, stage=stage))
                log.info("%s: engine %d / %d started in %.1f s", stage, index + 1, count,
                         time.perf_counter() - began)  # fmt: skip
        except BaseException:
            self.shutdown()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        self.engines = []

    def generate(self, *, input_ids: list[list[int]], sampling_params: dict) -> list[dict]:
        """`Engine.generate`'s batch call over every engine: one output dict per prompt, in order."""
        if not input_ids:
            return []
        if len(self.engines) == 1:
            return self.engines[0].generate(input_ids=input_ids, sampling_params=sampling_params)
        shares = [share for share in deal(input_ids, len(self.engines)) if share]
        results: list[dict] = [{} for _ in input_ids]
        with concurrent.futures.ThreadPoolExecutor(len(shares), thread_name_prefix="eyas-engine") as pool:
            futures = {
                pool.submit(engine.generate, input_ids=[input_ids[i] for i in share],
                            sampling_params=sampling_params): share
                for engine, share in zip(self.engines, shares, strict=False)
            }  # fmt: skip
            self._wait(futures)
            for future, share in futures.items():
                for i, out in zip(share, future.result(), strict=True):
                    results[i] = out
        return results

    def _wait(self, futures: dict) -> None:
        """Until every engine's call returns; an engine process that died stops them all."""
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=POLL_S)
            dead = [p for engine in self.engines for p in dead_processes(engine)]
            failed = [f for f in done if f.exception() is not None]
            if dead or any(e.died for e in self.engines if getattr(e, "died", None)):
                self._stop_all(futures)
                what = ", ".join(dead) or "an engine process (its error is logged above)"
                raise EngineDied(death_message(self.stage, f"{what} exited while the engine was in use"))
            if failed:
                self._stop_all(futures)
                raise failed[0].exception()

    def _stop_all(self, futures: dict) -> None:
        """Kill every engine process and wake the threads still waiting on their engine's loop."""
        from sglang.srt.utils.common import kill_process_tree

        kill_process_tree(os.getpid(), include_parent=False)
        for engine in self.engines:
            engine.died = engine.died or "stopped: another engine of the job died"
            engine.loop.call_soon_threadsafe(engine.loop.stop)
        concurrent.futures.wait(futures, timeout=30)
