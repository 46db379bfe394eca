"""The generation engines of a job: one or several SGLang engines on the job's GPUs, started once and fed
every prompt the job generates from (regeneration's rounds of every split; later the target-written
prompts too), so a job pays for one start-up, not one per split or stage.

Why several: at a small target one engine's scheduler process, not the GPU, sets the rate (SmolLM2 on an
H200: the GPU was 14-25% busy while one engine regenerated), and SGLang's `dp_size` places each replica
on a GPU of its own (`gpu_id_step` >= 1, sglang 0.5.17 `server_args.py`). `GenerationEngines` starts
`count` engines one after the other, each with an equal share of the memory (`memory_shares`), all on
the first engine's event loop, and deals each call's prompts among them, prompt i to engine i mod
count: their `async_generate` calls run together on that loop in the job's main thread (the engines'
schedulers are processes of their own).
One engine is called exactly as before.

An engine process that dies while several engines work: SGLang's watchdog sends the job SIGQUIT, whose
handler (the last engine's: they share the loop) kills every engine process and stops the loop; the
call then raises `EngineDied` naming the stage and every dead process, read from the engines' own
`SubprocessWatchdog`s.
"""

from __future__ import annotations

import asyncio
import logging
import time

from eyas.engine.sglang import SOME_PROCESS, EngineDied, dead_processes, death_message, start_engine

log = logging.getLogger("eyas.generation")


def memory_shares(fraction: float, count: int) -> list[float]:
    """Each engine's `mem_fraction_static` so that `count` engines started one after another share
    `fraction` of the GPU memory equally. SGLang 0.5.17 sizes an engine's static memory as its
    `mem_fraction_static` of the memory free when *that* engine starts
    (`kv_cache_configurator._profile_available_bytes`), so one fraction for all would give the first
    engine half, the next a quarter, ... at 0.5; engine i starts with 1 - i * fraction / count free."""
    share = fraction / count
    return [share / (1 - index * share) for index in range(count)]


def deal(prompts: list, count: int) -> list[list[int]]:
    """Indices of `prompts` per engine: prompt i to engine i mod count (equal counts, mixed lengths)."""
    return [list(range(e, len(prompts), count)) for e in range(count)]


class GenerationEngines:
    """`count` engines of `args` (one `EyasEngine` each), called as one engine: `generate(input_ids=...,
    sampling_params=...)`. A context manager: the engines stop on exit."""

    def __init__(self, args: dict, *, count: int, stage: str, start=start_engine):
        if count < 1:
            raise ValueError(f"regenerate.engine.engines: {count} must be >= 1")
        self.stage, self.engines = stage, []
        shares = memory_shares(args["mem_fraction_static"], count)
        try:
            for index, share in enumerate(shares):
                began = time.perf_counter()
                loop = self.engines[0].loop if self.engines else None
                engine_args = args | {"mem_fraction_static": share}
                self.engines.append(start(engine_args, speculative=False, stage=stage, loop=loop))
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
