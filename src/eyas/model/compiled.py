"""`train.compile`'s one wrapper: a pure tensor function through `torch.compile`, once per process.

Dynamic shapes, because a drafter's batches change rows and lengths with every step (and a step's last
loss block is shorter): one compilation serves them all instead of one per shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


@functools.cache
def compiled(fn: Callable) -> Callable:
    """`fn` compiled by inductor with dynamic shapes; the same wrapper for every caller."""
    return torch.compile(fn, dynamic=True)


def compiled_if(fn: Callable, on: bool) -> Callable:
    """`compiled(fn)` when `on` (train.compile), else `fn` itself."""
    return compiled(fn) if on else fn


def compile_counters(since: dict | None = None) -> dict:
    """What torch.compile did in this process (dynamo's own counters), less `since` (an earlier
    return): frames compiled, graphs, graph breaks and what it gave up on. A frame over
    `torch._dynamo.config.recompile_limit` runs eager from then on, with only a warning: the
    `unimplemented` reasons name it (first line of each). `caches`: the hits and misses of inductor's
    compiled-graph cache and AOTAutograd's (`TORCHINDUCTOR_CACHE_DIR`), which say whether a cache
    carried to a new machine served its first step."""
    from torch._dynamo.utils import counters

    now = {
        "frames": dict(counters["frames"]),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "unimplemented": {reason.splitlines()[0]: n for reason, n in counters["unimplemented"].items()},
        "caches": {
            name: n
            for group in ("inductor", "aot_autograd")
            for name, n in counters[group].items()
            if "cache" in name
        },
    }
    if since is None:
        return now

    def minus(a, b):  # a count, or counts by name (names whose count did not change left out)
        if isinstance(a, int):
            return a - b
        return {key: n - b.get(key, 0) for key, n in a.items() if n - b.get(key, 0)}

    return {key: minus(value, since[key]) for key, value in now.items()}
