"""Host side of extraction: one thread owns the store writer; a pool encodes and writes chunks.

The writer thread takes staged batches from a bounded queue (a slow disk or codec pushes back on the
model instead of piling batches up in memory), waits for each batch's copy event, and assembles
whole chunks (`HiddenStoreWriter` is not thread-safe). Full chunks go to a thread pool that
compresses and writes disjoint chunks in parallel: Blosc and file writes release the GIL.
zarr + zstd cost ~4 cores per GB/s of hidden states (zarr-python alone writes ~260 MB per CPU-second
even without a codec), so the pool is sized from the job's threads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from eyas.extract.staging import PinnedPool, StagedBatch
from eyas.store import HiddenStoreWriter

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


class BatchWriter:
    """The one thread that owns the HiddenStoreWriter, fed through a bounded queue."""

    def __init__(
        self,
        store: HiddenStoreWriter,
        pool: PinnedPool | None,
        writer_threads: int,
        shard_ids: np.ndarray | None = None,
    ):
        """`shard_ids`: the token shard's flat input_ids; pieces' token ids are checked against them."""
        if writer_threads < 1:
            raise ValueError(f"extract: writer_threads must be >= 1, got {writer_threads}")
        self.store, self.pool, self.shard_ids = store, pool, shard_ids
        self.kh = store.widths["aux"]
        self.chunks = ChunkPool(store, writer_threads) if writer_threads > 1 else None
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
                    self._write(item)
            except BaseException as exc:  # handed to the main thread by put()/close()
                self.error = exc
            finally:
                if item.ready is not None:
                    item.ready.synchronize()  # never recycle a buffer a copy may still be filling
                if self.pool is not None:
                    for buffer in item.buffers:
                        self.pool.release(buffer)

    def _write(self, item: StagedBatch) -> None:
        if item.ready is not None:
            item.ready.synchronize()
        rows = item.rows.numpy()  # [B, T, (K+1)H] uint16 (bf16 bits) or uint8 (e4m3 bits)
        scale = item.scale.numpy() if item.scale is not None else None  # [B, T, K+1]
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
        ids = item.token_ids.numpy() if item.token_ids is not None else None  # [T]
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
        if self.chunks is not None:
            self.chunks.close()
        self._raise()

    def abort(self) -> None:
        """Drop what is queued and wait until nothing writes into the store any more."""
        self.aborted = True
        self.queue.put(None)
        self.thread.join()
        if self.chunks is not None:
            self.chunks.abort()


def empty_rows(indices: list[int], groups: int, hidden: int, storage: str) -> StagedBatch:
    """Zero-length samples own no rows but must still be marked written (groups = taps + final)."""
    count = len(indices)
    dtype = torch.uint16 if storage == "bf16" else torch.uint8
    rows = torch.zeros(count, 0, groups * hidden, dtype=dtype)
    scale = None if storage == "bf16" else torch.zeros(count, 0, groups, dtype=torch.float32)
    return StagedBatch(list(indices), [0] * count, rows, scale)
