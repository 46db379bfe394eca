"""Extraction's store writing in a child process, so that the model's process keeps its GIL.

Why: SGLang's scheduler drives the GPU from one Python thread and, at a small target, is CPU-bound. The
writer threads of `eyas.extract.writer` assemble chunks in numpy and zarr-python, holding the GIL for
much of their work: on an H100 with a 135M target the capture ran at 0.62x of the engine's bare
prefill, 0.78x with the writers' work dropped after the pinned copy
(bench/results/extraction-drop-h100-smollm2.json). Here the same `RowWriter` runs in a child process
(`spawn`; it imports neither sglang nor CUDA) that owns the store: it opens `hidden_store_writer`,
writes every batch, finishes the store (atomic rename) at `close` and sends its figures back
(`peak_pending_chunks` among them). `open_store_writer` picks it or the thread (`StoreWriter`).

The model's side starts no thread and does little Python a batch. Batches land (on the CUDA side stream,
as for the thread writer) in page-locked shared memory (`eyas.extract.shared_segments`, at most
`MAX_SEGMENTS` segments: when all are in use the next batch waits, counted in `wait_seconds`; /dev/shm
must hold 4 x 1.25 x the largest batch, for SmolLM2's 8,192-token forwards 4 x 45 MiB in bf16). The child
is started first (`WriterChild`: the SGLang hook starts it when the engine's scheduler process starts, so
its imports overlap the model's load) and told which store to open: ("open", store args, writer threads,
token shard). `put` sends each batch whose copy event has completed (`Event.query`, which does not block)
over a pipe, never its bytes: ("batch", segment, indices, lengths, pieces, arrays, sent), arrays the
(offset, shape, dtype) of rows, scale and token ids, `sent` the `time.monotonic()` of the send; then
("forget", segment) for a replaced segment, ("close",) or ("abort",). The child says ("ready",) once it
has opened the store (`wait_ready` waits for it), maps a segment the first time it is named and answers
("free", segment) once the batch is in the store, ("error", message) when one fails, and last ("done",
stats) or ("failed", message, stats). A child's error reaches the parent's next `put` or `close` as a
RuntimeError; a child that dies is noticed while the parent waits (its pipe ends, `is_alive`) and what it
left is removed. Segments are unlinked at `close` and `abort`, whatever happened.

Where the waits go (`stats`): the parent counts them and the part spent waiting for a batch's copy (the
GPU behind the scheduler); the child sums how long batches sat in the pipe before it read them (its
loop busy, or starved of its GIL by its writer threads).
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import secrets
import shutil
import time
import traceback
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import torch

from eyas.core.atomic import tmp_sibling
from eyas.core.logs import child_stage_logging
from eyas.extract.shared_segments import SegmentPool
from eyas.extract.staging import StagedBatch, host_layout, host_views
from eyas.extract.writer import RowWriter, StoreWriter
from eyas.store import hidden_store_writer, read_token_shard

MAX_SEGMENTS = 4  # batches in flight: one being copied, some waiting to be sent, one being written
POLL_SECONDS = 0.1  # how often a waiting parent looks whether the child is still alive
ABORT_SECONDS = 30.0  # how long `abort` lets the child remove its store before killing it


def _where(base: int, tensor: torch.Tensor | None) -> tuple | None:
    """(byte offset in the segment at `base`, shape, numpy dtype name) of a host view, or None."""
    if tensor is None:
        return None
    return tensor.data_ptr() - base, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")


class WriterChild:
    """The writer process, started before its store or the batches' device is known: its imports
    (torch, zarr) take seconds, which a job pays while its engine loads instead of in its first
    batches. It waits for `ProcessWriter`'s ("open", ...) and ends with its parent (a daemon)."""

    def __init__(self):
        if multiprocessing.current_process().daemon:  # SGLang's scheduler processes are not
            raise RuntimeError("extract: writer_process needs a process that may start one (not a daemon)")
        context = multiprocessing.get_context("spawn")
        self.conn, child_conn = context.Pipe()
        self.abort_event = context.Event()
        self.process = context.Process(
            target=child_main, args=(child_conn, self.abort_event), name="eyas-store-writer", daemon=True
        )
        self.process.start()
        child_conn.close()


class ProcessWriter:
    """`StoreWriter`'s interface (`put`, `close`, `abort`, `wait_seconds`, `peak_pending_chunks`,
    `stats`, `pool`, `copy_stream`) with the store and its writer in a child process."""

    def __init__(
        self,
        store_args: dict,
        device: torch.device,
        writer_threads: int,
        *,
        token_shard: str | None = None,
        max_segments: int = MAX_SEGMENTS,
        child: WriterChild | None = None,
    ):
        """`child`: one started earlier (`WriterChild`), told here which store to open; else one is
        started now, and its imports delay the first batches (`wait_ready`)."""
        if writer_threads < 1:
            raise ValueError(f"extract: writer_threads must be >= 1, got {writer_threads}")
        child = child if child is not None else WriterChild()
        self.process, self.conn, self.abort_event = child.process, child.conn, child.abort_event
        self.path, cuda = store_args["path"], device.type == "cuda"
        self.prefix = f"eyas-{os.getpid()}-{secrets.token_hex(3)}-"  # its /dev/shm entries
        self.copy_stream = torch.cuda.Stream(device) if cuda else None
        self.pool = SegmentPool(self.prefix, max_segments, cuda, self._make_room, self._forget)
        self.wait_seconds, self.child_stats = 0.0, {}
        # where the waits went: how many, how much of them on a batch's copy (the GPU behind the
        # scheduler) rather than on the child, and the batch that first waited
        self.waits = {"count": 0, "copy_seconds": 0.0, "first_batch": None}
        self.batches = 0
        self.error, self.final, self.closed, self.released = None, None, False, False
        self.ready = False  # the child has opened the store
        self._pending: collections.deque = collections.deque()  # (copy event or None, message), unsent
        self._send(("open", store_args, writer_threads, token_shard))

    @property
    def peak_pending_chunks(self) -> int:
        return self.child_stats.get("peak_pending_chunks", 0)

    @property
    def stats(self) -> dict:
        child = {k: v for k, v in self.child_stats.items() if k != "peak_pending_chunks"}
        waits = {f"wait_{k}": v for k, v in self.waits.items()}
        return {f"writer_process_{k}": v for k, v in (child | waits).items()}

    # ---------------------------------------------------------------- the scheduler's side, per batch
    def put(self, item: StagedBatch) -> None:
        """Record the batch and send every batch whose copy has landed; never blocks on the child
        unless all segments are in use. The batch's host views are dropped: the writer owns it now."""
        if self.closed:
            raise RuntimeError("extract: a batch for a writer process already closed")
        self._reap()
        arrays = (item.rows, item.scale, item.token_ids)
        if item.ready is None:  # on the host already: copied into a segment here
            present = [a for a in arrays if a is not None]
            offsets, total = host_layout(present)
            segment = self.pool.take(total)
            views = iter(host_views(segment.tensor, present, offsets))
            arrays = tuple(None if a is None else next(views).copy_(a) for a in arrays)
        else:
            segment = self.pool.of(item.buffers[0])
        where = tuple(_where(segment.ptr, a) for a in arrays)
        message = ("batch", segment.name, list(item.indices), list(item.lengths), item.pieces, where)
        self._pending.append((item.ready, message))
        item.rows = item.scale = item.token_ids = None  # no view of the segment outlives it
        item.buffers = ()
        self.batches += 1
        self._send_ready()

    def _send_ready(self) -> None:
        while self._pending and (self._pending[0][0] is None or self._pending[0][0].query()):
            # stamped with the system-wide monotonic clock: the child counts how long it sat in the pipe
            self._send((*self._pending.popleft()[1], time.monotonic()))

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError: the child is gone
            raise self._died() from None

    def _forget(self, name: str) -> None:
        self._send(("forget", name))  # a replaced segment: the child unmaps it

    def _reap(self, timeout: float = 0.0) -> None:
        """Take the child's replies (segments freed, an error, its last word); raise its error, or
        its death when a wait of `timeout` brought nothing."""
        heard = False
        try:
            while self.final is None and self.conn.poll(0.0 if heard else timeout):
                heard, message = True, self.conn.recv()
                if message[0] == "free":
                    self.pool.release_name(message[1])
                elif message[0] == "ready":
                    self.ready = True
                elif message[0] == "error":
                    self.error = self.error or message[1]
                else:
                    self.final = message
        except (EOFError, OSError):
            raise self._died() from None
        if self.error is not None:
            raise RuntimeError(f"extract: the writer process failed: {self.error}")
        if timeout and not heard and not self.process.is_alive():
            raise self._died()

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until the child has imported its modules and opened the store (a job starts it before
        its first timed batch); raise its error or its death, or a TimeoutError after `timeout` s."""
        deadline = time.perf_counter() + timeout
        while not self.ready:
            if self.final is not None:  # it failed before it could open the store
                raise RuntimeError(f"extract: the writer process failed: {self.final[1]}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"extract: the writer process did not open {self.path} in {timeout:.0f} s")
            self._reap(POLL_SECONDS)

    def _make_room(self) -> None:
        """All segments are in use: take the frees already in the pipe (read only at the next `put`
        otherwise, after this batch's segment is taken); failing that, send what has landed and wait
        until the child frees one."""
        self._reap()
        if self.pool.free:
            return
        start = time.perf_counter()
        self.waits["count"] += 1
        if self.waits["first_batch"] is None:
            self.waits["first_batch"] = self.batches
        try:
            while not self.pool.free:
                if self._pending and self._pending[0][0] is not None:
                    copied = time.perf_counter()
                    self._pending[0][0].synchronize()
                    self.waits["copy_seconds"] += time.perf_counter() - copied
                self._send_ready()
                self._reap(POLL_SECONDS)
        finally:
            self.wait_seconds += time.perf_counter() - start

    def _died(self) -> RuntimeError:
        self.process.join(5)
        return RuntimeError(
            f"extract: the writer process died (exit code {self.process.exitcode}) before {self.path} "
            "was finished"
        )

    # ---------------------------------------------------------------- the end
    def close(self) -> None:
        """Send what is left and let the child finish the store; raise its error or its death."""
        if self.closed:
            return
        self.closed = True
        try:
            while self._pending:
                if self._pending[0][0] is not None:
                    self._pending[0][0].synchronize()
                self._send_ready()
            self._send(("close",))
            while self.final is None:
                self._reap(POLL_SECONDS)
            self.child_stats = self.final[-1]
            if self.final[0] != "done":
                raise RuntimeError(f"extract: the writer process failed: {self.final[1]}")
            self.process.join()
        except BaseException:
            self._stop()
            raise
        finally:
            self._release()

    def abort(self) -> None:
        """Stop the child and remove the unfinished store; nothing to do after `close`."""
        if self.released:
            return
        self.closed = True
        self._stop()
        with contextlib.suppress(RuntimeError):  # an abort runs beside an error: it must not hide it
            self._release()

    def _stop(self) -> None:
        if self.copy_stream is not None:  # no copy may still be filling a segment when it is unmapped
            with contextlib.suppress(RuntimeError):  # a CUDA error that stopped the run: nothing runs
                self.copy_stream.synchronize()
        self._pending.clear()
        self.abort_event.set()  # the child skips the batches it has not written yet
        with contextlib.suppress(OSError):
            self.conn.send(("abort",))
        self.process.join(ABORT_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        shutil.rmtree(tmp_sibling(self.path, self.process.pid), ignore_errors=True)  # a killed child's

    def _release(self) -> None:
        self.released = True
        self.pool.close()
        self.conn.close()


def open_store_writer(
    store_args: dict,
    device: torch.device,
    writer_threads: int,
    *,
    process: bool = False,
    token_shard: str | None = None,
    shard_ids: np.ndarray | None = None,
    child: WriterChild | None = None,
) -> StoreWriter | ProcessWriter:
    """The store at `store_args` (`hidden_store_writer`'s keyword arguments) with its writer: a thread of
    this process (`StoreWriter`) or, with `process`, a child process (`ProcessWriter`). Pieces' token ids
    are checked against `shard_ids` (the thread) or the ids of `token_shard` (the child reads them)."""
    if process:
        return ProcessWriter(store_args, device, writer_threads, token_shard=token_shard, child=child)
    return StoreWriter(store_args, device, writer_threads, shard_ids)


# -------------------------------------------------------------------- the child process
def child_main(conn, abort) -> None:
    """The writer process: wait for the store to open, write the batches the pipe names, finish it at
    `close`. A parent that ends before it names a store (or aborts first) leaves nothing behind."""
    child_stage_logging()
    try:
        message = conn.recv()
    except EOFError:  # the parent never opened a store (an SGLang rank that writes none)
        return
    start = time.perf_counter()
    stats = {"batches": 0, "busy_seconds": 0.0, "queued_seconds": 0.0, "queued_max_seconds": 0.0}
    segments: dict[str, SharedMemory] = {}
    try:
        if message[0] != "open":
            raise _Stopped("aborted before the store was opened")
        _write_store(conn, abort, *message[1:], segments, stats)
        reply = ("done", stats)
    except _Stopped as stop:  # a batch's error, already printed, or an abort
        reply = ("failed", str(stop), stats)
    except BaseException as exc:  # reported to the parent; a parent that is gone hears nothing
        traceback.print_exc()
        reply = ("failed", f"{type(exc).__name__}: {exc}", stats)
    stats["seconds"] = time.perf_counter() - start
    _unmap(segments)
    with contextlib.suppress(OSError):
        conn.send(reply)
    conn.close()


class _Stopped(Exception):
    """The store is not finished: a batch failed (the message says how) or the parent aborted."""


def _write_store(conn, abort, store_args, writer_threads, token_shard, segments, stats) -> None:
    shard_ids = read_token_shard(token_shard).input_ids if token_shard is not None else None
    with hidden_store_writer(**store_args) as store:
        writer = RowWriter(store, writer_threads, shard_ids)
        conn.send(("ready",))
        try:
            error = _serve(conn, abort, writer, segments, stats)
            if error is not None or abort.is_set():
                raise _Stopped(error or "aborted")
            writer.close_chunks()
        except BaseException:
            writer.abort_chunks()
            raise  # the unfinished store is removed
        stats["peak_pending_chunks"] = store.peak_pending_chunks
    # leaving the block finished the store: every sample written, attrs set, renamed into place


def _serve(conn, abort, writer: RowWriter, segments: dict, stats: dict) -> str | None:
    """Write the batches the parent sends until `close` or `abort`; returns the first error. After
    an error the batches are still answered (freed), unwritten, so the parent never waits forever."""
    error = None
    while True:
        message = conn.recv()
        if message[0] == "batch":
            queued = max(0.0, time.monotonic() - message[-1])  # sent until read: this loop was busy
            stats["queued_seconds"] += queued
            stats["queued_max_seconds"] = max(stats["queued_max_seconds"], queued)
            if error is None and not abort.is_set():
                start = time.perf_counter()
                try:
                    writer.write(_host_batch(message, segments))
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                    conn.send(("error", error))
                stats["busy_seconds"] += time.perf_counter() - start
                stats["batches"] += 1
            conn.send(("free", message[1]))
        elif message[0] == "forget":
            _unmap({message[1]: segments.pop(message[1])} if message[1] in segments else {})
        else:
            return error


def _host_batch(message: tuple, segments: dict[str, SharedMemory]) -> StagedBatch:
    """A batch message as numpy views of its segment, mapped here the first time it is named."""
    _, name, indices, lengths, pieces, arrays, _sent = message
    if name not in segments:
        segments[name] = SharedMemory(name=name)
    buf = segments[name].buf
    rows, scale, ids = (
        None if a is None else np.ndarray(a[1], np.dtype(a[2]), buffer=buf, offset=a[0]) for a in arrays
    )
    return StagedBatch(indices, lengths, rows, scale, pieces=pieces, token_ids=ids)


def _unmap(segments: dict[str, SharedMemory]) -> None:
    for shm in segments.values():
        with contextlib.suppress(BufferError):  # a view still alive: unmapped when the process ends
            shm.close()
