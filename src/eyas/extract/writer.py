"""Host side of extraction: one thread owns the store writer; a pool encodes and writes chunks.

The writer thread takes staged batches from a bounded queue (a slow disk or codec pushes back on the
model instead of piling batches up in memory), waits for each batch's copy event, and assembles
whole chunks (`HiddenStoreWriter` is not thread-safe). Full chunks go to a thread pool that
compresses and writes disjoint chunks in parallel: Blosc and file writes release the GIL.
zarr + zstd cost ~4 cores per GB/s of hidden states (zarr-python alone writes ~260 MB per CPU-second
even without a codec), so the pool is sized from the job's threads.

`RowWriter` is that assembly without the thread, on host arrays: `BatchWriter` runs it on its thread
in the model's process (`StoreWriter`: the store and that thread), `eyas.extract.writer_process` in a
child process (`extract.writer_process`; its `open_store_writer` picks one or the other).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from eyas.extract.staging import PinnedPool, StagedBatch, staging_resources
from eyas.store import HiddenStoreWriter, hidden_store_writer

QUEUE_BATCHES = 2  # batches waiting for the writer: enough to hide jitter, bounded for memory


class ChunkPool:
    """Encode and write whole chunks on a thread pool; chunks are disjoint files, so this is safe.

    Becomes the store writer's `submit`; a semaphore bounds the chunks in flight so memory stays flat
    when the codec or the disk is the bottleneck.
    """

    def __init__(self, store: HiddenStoreWriter, threads: int):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="eyas-chunk")
        self._slots = threading.BoundedSemaphore(2 * threads)
        self._futures: list[Future] = []
        store.submit = self.submit

    def submit(self, fn: Callable, *args) -> None:
        self._slots.acquire()
        future = self._pool.submit(fn, *args)
        future.add_done_callback(lambda _: self._slots.release())
        self._futures = [f for f in self._futures if not f.done() or f.exception() is not None]
        self._futures.append(future)
        self.raise_errors()

    def raise_errors(self) -> None:
        for future in self._futures:
            if future.done() and future.exception() is not None:
                raise future.exception()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.raise_errors()

    def abort(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _host(array) -> np.ndarray | None:
    """A staged tensor on the host as numpy (the writer process hands numpy views already)."""
    return array if array is None or isinstance(array, np.ndarray) else array.numpy()


class RowWriter:
    """Staged batches' rows into the store, on the calling thread; whole chunks through the pool."""

    def __init__(self, store: HiddenStoreWriter, writer_threads: int, shard_ids: np.ndarray | None = None):
        """`shard_ids`: the token shard's flat input_ids; pieces' token ids are checked against them."""
        if writer_threads < 1:
            raise ValueError(f"extract: writer_threads must be >= 1, got {writer_threads}")
        self.store, self.shard_ids = store, shard_ids
        self.kh = store.widths["aux"]
        self.chunks = ChunkPool(store, writer_threads) if writer_threads > 1 else None

    @property
    def peak_pending_chunks(self) -> int:
        return self.store.peak_pending_chunks

    def write(self, item: StagedBatch) -> None:
        """One staged batch into the store (waiting for its copy first); a piece's token ids that differ
        from the shard's are refused, naming the sample."""
        if item.ready is not None:
            item.ready.synchronize()
        rows = _host(item.rows)  # [B, T, (K+1)H] uint16 (bf16 bits) or uint8 (e4m3 bits)
        scale = _host(item.scale)  # [B, T, K+1] float32, or None
        if item.pieces is not None:
            self._write_pieces(item, rows[0], None if scale is None else scale[0])
            return
        for b, (index, n) in enumerate(zip(item.indices, item.lengths, strict=True)):
            aux, final = rows[b, :n, : self.kh], rows[b, :n, self.kh :]
            if scale is None:
                self.store.write_sample(index, aux, final)
            else:
                self.store.write_sample(index, aux, final, scale[b, :n])

    def _write_pieces(self, item: StagedBatch, rows: np.ndarray, scale: np.ndarray | None) -> None:
        ids = _host(item.token_ids)  # [T]
        for index, start, row, n in item.pieces:
            if ids is not None and self.shard_ids is not None:
                lo = int(self.store.offsets[index]) + start
                want, got = self.shard_ids[lo : lo + n], ids[row : row + n]
                if not np.array_equal(want, got):
                    at = int(np.flatnonzero(want != got)[0])
                    raise ValueError(
                        f"sample {index}: rows [{start}, {start + n}) were computed for other tokens "
                        f"than the shard's (token {start + at}: {got[at]} != {want[at]})"
                    )
            part = rows[row : row + n]
            self.store.write_rows(
                index,
                start,
                part[:, : self.kh],
                part[:, self.kh :],
                None if scale is None else scale[row : row + n],
            )

    def close_chunks(self) -> None:
        """Wait for every chunk on disk; re-raise a chunk's error."""
        if self.chunks is not None:
            self.chunks.close()

    def abort_chunks(self) -> None:
        if self.chunks is not None:
            self.chunks.abort()


class BatchWriter(RowWriter):
    """The one thread that owns the HiddenStoreWriter, fed through a bounded queue."""

    def __init__(
        self,
        store: HiddenStoreWriter,
        pool: PinnedPool | None,
        writer_threads: int,
        shard_ids: np.ndarray | None = None,
    ):
        """`shard_ids`: the token shard's flat input_ids; pieces' token ids are checked against them."""
        super().__init__(store, writer_threads, shard_ids)
        self.pool = pool
        self.queue: queue.Queue[StagedBatch | None] = queue.Queue(maxsize=QUEUE_BATCHES)
        self.error: BaseException | None = None
        self.aborted = False
        self.wait_seconds = 0.0  # time the model thread spent blocked on a full queue (back-pressure)
        self.thread = threading.Thread(target=self._run, name="eyas-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # Keep consuming until the sentinel even after an error, so the producer never blocks forever.
        while (item := self.queue.get()) is not None:
            try:
                if self.error is None and not self.aborted:
                    self.write(item)
            except BaseException as exc:  # handed to the main thread by put()/close()
                self.error = exc
            finally:
                if item.ready is not None:
                    item.ready.synchronize()  # never recycle a buffer a copy may still be filling
                if self.pool is not None:
                    for buffer in item.buffers:
                        self.pool.release(buffer)

    def put(self, item: StagedBatch) -> None:
        start = time.perf_counter()
        try:
            while True:
                self._raise()
                try:
                    self.queue.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue
        finally:
            self.wait_seconds += time.perf_counter() - start

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"extract: the writer thread failed: {self.error}") from self.error

    def close(self) -> None:
        """Drain the queue, wait for every chunk on disk, re-raise a writer error."""
        self.queue.put(None)
        self.thread.join()
        self.close_chunks()
        self._raise()

    def abort(self) -> None:
        """Drop what is queued and wait until nothing writes into the store any more."""
        self.aborted = True
        self.queue.put(None)
        self.thread.join()
        self.abort_chunks()


class StoreWriter:
    """The store and its writer thread, opened together in this process: `close` drains the writer and
    finishes the store (`hidden_store_writer`: written under a temporary name, renamed when complete),
    `abort` removes the unfinished store. `eyas.extract.writer_process.ProcessWriter` is the same with
    the store in a child process. `pool` and `copy_stream` are what `stage_batch` copies with."""

    def __init__(
        self, store_args: dict, device: torch.device, writer_threads: int, shard_ids: np.ndarray | None = None
    ):
        self._stack, self.closed = contextlib.ExitStack(), False
        self.store = self._stack.enter_context(hidden_store_writer(**store_args))
        self.pool, self.copy_stream = staging_resources(device)
        try:
            self.writer = BatchWriter(self.store, self.pool, writer_threads, shard_ids)
        except BaseException as err:
            self._exit(err)
            raise

    @property
    def wait_seconds(self) -> float:
        return self.writer.wait_seconds

    @property
    def peak_pending_chunks(self) -> int:
        return self.store.peak_pending_chunks

    @property
    def stats(self) -> dict:
        """Figures of the writer beyond `wait_seconds` and `peak_pending_chunks` (the process's)."""
        return {}

    def put(self, item: StagedBatch) -> None:
        self.writer.put(item)

    def _exit(self, err: BaseException) -> None:
        self._stack.__exit__(type(err), err, err.__traceback__)  # the unfinished store is removed

    def close(self) -> None:
        self.closed = True
        try:
            self.writer.close()
        except BaseException as err:
            self._exit(err)
            raise
        self._stack.close()

    def abort(self) -> None:
        """Stop writing and remove the unfinished store; nothing to do after `close`."""
        if self.closed:
            return
        self.closed = True
        self.writer.abort()
        self._exit(RuntimeError("extract: the store writer was aborted"))


def empty_rows(indices: list[int], groups: int, hidden: int, storage: str) -> StagedBatch:
    """Zero-length samples own no rows but must still be marked written (groups = taps + final)."""
    count = len(indices)
    dtype = torch.uint16 if storage == "bf16" else torch.uint8
    rows = torch.zeros(count, 0, groups * hidden, dtype=dtype)
    scale = None if storage == "bf16" else torch.zeros(count, 0, groups, dtype=torch.float32)
    return StagedBatch(list(indices), [0] * count, rows, scale)
