"""Disk pre-flight: a job whose outputs will not fit is refused before it starts its work (hours of GPU
time, then a full disk), with both numbers: what it needs and what is free."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class DiskSpaceError(OSError):
    """The outputs of a job would not fit on the disk it writes to."""


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes (for this user) on the filesystem `path` will be on: that of its nearest existing
    ancestor, since outputs are written before their directory exists."""
    where = Path(path).absolute()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(path: str | os.PathLike, need: int, what: str) -> None:
    """Refuse (`DiskSpaceError`, naming `what`, both sizes and the path) when `need` bytes exceed the
    free space where `path` will be written."""
    free = free_bytes(path)
    if need > free:
        raise DiskSpaceError(
            f"{what}: needs ~{gib(need)} at {path}, but only {gib(free)} is free there; free space or "
            "write results elsewhere (snakemake --directory) and rerun"
        )
