"""Atomic outputs: write under a temporary sibling path, rename into place when complete.

A job killed mid-write leaves only a `*.tmp-*` sibling, which no reader or Snakemake takes for a
finished output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def tmp_sibling(path: str | os.PathLike, pid: int | None = None) -> Path:
    """Where process `pid` (this one by default) writes `path` before the rename: a process that
    waits on a killed writer removes what it left."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid() if pid is None else pid}")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that becomes `path` on success (replacing any old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, path)


def _swap_in(tmp: Path, path: Path) -> None:
    """Put the finished `tmp` dir at `path`. An old `path` is first renamed aside (atomic) and only
    then deleted: deleting it in place is not atomic, and a job killed mid-delete would leave a
    half-deleted old output that still looks finished (its missing zarr chunks read back as zeros)."""
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """Open a temporary file that becomes `path` on success; fsynced before the rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    encoding = None if "b" in mode else "utf-8"
    try:
        with open(tmp, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    os.replace(tmp, path)


def atomic_path(path: str | os.PathLike) -> contextlib.AbstractContextManager[Path]:
    """Yield a temporary file path (for writers that take a path) that becomes `path` on success."""
    return _atomic_path(Path(path))


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    os.replace(tmp, path)
