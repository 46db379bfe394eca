"""The row sink of the SGLang capture: an extend forward's rows, by sample, into the hidden store.

Runs in the engine's scheduler process (`eyas.extract.sglang_capture` feeds it) and imports no sglang.
`forward_batch.rids`, `extend_prefix_lens_cpu` and `extend_seq_lens_cpu` say which rows of a packed
extend batch belong to which of this job's samples and where in it (`batch_pieces`); the rows are
encoded on the device, copied into reused pinned buffers on a side stream (`extract.staging`) and
written by the same writer as the HF backend (`extract.writer`, `HiddenStoreWriter.write_rows`
reassembles chunked prefill): threads of this process, or with `writer_process` a child process of the
scheduler (`extract.writer_process`), where zarr's Python holds no GIL the scheduler needs. The forward
that completes the last sample finishes the store (atomic rename) and leaves the run's stats for the
job process (`RowSink.close`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import torch

from eyas.core.atomic import atomic_file
from eyas.extract.job import peak_rss_bytes
from eyas.extract.staging import stage_batch
from eyas.extract.writer import empty_rows
from eyas.extract.writer_process import WriterChild, open_store_writer
from eyas.store import read_token_shard


class PrefixReuseError(RuntimeError):
    """A sample's first rows were served from a cache: they were never computed, so never captured."""


def request_rid(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def warmup_rid(prefix: str, index: int) -> str:
    """The id of a warm-up request of this job: the hook skips its rows (`batch_pieces`)."""
    return f"warmup-{prefix}{index}"


def batch_pieces(
    rids: list[str] | None, prefix_lens: list[int] | None, extend_lens: list[int] | None, prefix: str
) -> list[tuple[int, int, int, int]]:
    """Rows of one packed extend batch -> (sample, first row in the sample, row in the batch, count)
    for this job's requests. Requests of others (warm-up, dummy runs) keep their rows but are skipped."""
    if rids is None or prefix_lens is None or extend_lens is None:
        return []
    pieces, row = [], 0
    for rid, start, count in zip(rids, prefix_lens, extend_lens, strict=True):
        if isinstance(rid, str) and rid.startswith(prefix) and rid[len(prefix) :].isdigit():
            pieces.append((int(rid[len(prefix) :]), int(start), row, int(count)))
        row += int(count)
    return pieces


@dataclass(frozen=True)
class CaptureSpec:
    """What the scheduler process needs to write the store; pickled into it by SGLang's spawn."""

    store: str
    token_shard: str
    stats_path: str
    attrs: dict
    hidden: int
    num_taps: int
    sglang_layer_ids: list[int]
    storage: str
    chunk_tokens: int
    writer_threads: int
    rid_prefix: str
    route: str
    chunks_per_shard: int = 1
    compression: str = "zstd"
    writer_process: bool = False


class RowSink:
    """Takes each extend forward's rows and writes them into the store; finishes it when complete."""

    def __init__(self, spec: CaptureSpec, device: torch.device, child: WriterChild | None = None):
        """`child`: the writer process started early (`writer_process`), else one starts here."""
        self.spec, self.start = spec, time.perf_counter()
        shard = read_token_shard(spec.token_shard)
        self.lengths = np.diff(shard.sample_offsets)
        self.received = np.zeros(len(self.lengths), dtype=np.int64)
        self.remaining = int(np.count_nonzero(self.lengths))
        self.forwards = 0
        store_args = dict(
            path=spec.store,
            sample_offsets=shard.sample_offsets,
            hidden_size=spec.hidden,
            num_taps=spec.num_taps,
            attrs=spec.attrs,
            chunk_tokens=spec.chunk_tokens,
            storage=spec.storage,
            chunks_per_shard=spec.chunks_per_shard,
            compression=spec.compression,
        )
        self.writer = open_store_writer(
            store_args,
            device,
            spec.writer_threads,
            process=spec.writer_process,
            token_shard=spec.token_shard,
            shard_ids=shard.input_ids,
            child=child,
        )
        empty = np.flatnonzero(self.lengths == 0).tolist()
        if empty:
            self.writer.put(empty_rows(empty, spec.num_taps + 1, spec.hidden, spec.storage))
        self.closed = False

    def take(self, pieces: list[tuple[int, int, int, int]], aux, final, input_ids) -> None:
        """aux [T', K*H], final [T', H], input_ids [T'] of one forward (T' >= rows of `pieces`)."""
        if self.closed or not pieces:
            return
        try:
            self._take(pieces, aux, final, input_ids)
        except BaseException:
            self.closed = True
            self.writer.abort()  # the unfinished store is removed
            raise

    def _take(self, pieces, aux, final, input_ids) -> None:
        for index, start, _, count in pieces:
            if not 0 <= index < len(self.lengths):
                raise ValueError(f"extract: request for sample {index}, the shard has {len(self.lengths)}")
            if start != self.received[index]:
                kind = PrefixReuseError if self.received[index] == 0 else RuntimeError
                raise kind(
                    f"extract: sample {index} arrived with rows from {start} on after {self.received[index]} "
                    "captured rows: its first rows came from a prefix cache (keep disable_radix_cache on) "
                    "or a chunk was lost"
                )
            self.received[index] += count
            if self.received[index] > self.lengths[index]:
                raise RuntimeError(
                    f"extract: sample {index} got {self.received[index]} rows of {self.lengths[index]}"
                )
            self.remaining -= int(self.received[index] == self.lengths[index])
        rows = max(row + count for _, _, row, count in pieces)
        taps, hidden = self.spec.num_taps, self.spec.hidden
        aux = aux[:rows].reshape(1, rows, taps, hidden)  # [1, T, K, H]
        final = final[:rows].reshape(1, rows, hidden)  # [1, T, H]
        staged = stage_batch(
            [p[0] for p in pieces],
            [p[3] for p in pieces],
            list(aux.unbind(2)),
            final,
            self.spec.storage,
            self.writer.pool,
            self.writer.copy_stream,
            token_ids=input_ids[:rows],
        )
        staged.pieces = pieces
        self.writer.put(staged)
        self.forwards += 1
        if self.remaining == 0:
            self.close()

    def close(self) -> None:
        """Drain the writer, finish the store (atomic rename) and leave the run's stats for the job."""
        self.closed = True
        self.writer.close()  # the store is removed when this fails
        seconds = time.perf_counter() - self.start
        stats = {
            "capture_seconds": seconds,
            "forwards": self.forwards,
            "writer_wait_seconds": self.writer.wait_seconds,
            "peak_pending_chunks": self.writer.peak_pending_chunks,
            "scheduler_peak_rss_bytes": peak_rss_bytes(),
            **self.writer.stats,
        }
        with atomic_file(self.spec.stats_path) as fh:
            json.dump(stats, fh)
