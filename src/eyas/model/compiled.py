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
