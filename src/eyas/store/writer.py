"""The write side: token shards in one call, hidden stores chunk by chunk. Both appear through
`atomic_dir`, so a store that exists is complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import google_crc32c
import numpy as np
import zarr

from eyas.core.atomic import atomic_dir
from eyas.store.layout import (
    CHUNK_TOKENS,
    HIDDEN_FORMAT,
    SHARD_EMPTY,
    STORED_DTYPES,
    TOKENS_FORMAT,
    chunk_encoder,
    codec_name,
    hidden_codec,
    hidden_layout,
)
from eyas.store.quant import SCALE_RULE, check_storage


def write_token_shard(
    path: str | os.PathLike,
    samples: list[tuple[np.ndarray, np.ndarray]],
    sample_ids: list[str],
    attrs: Mapping,
) -> None:
    """Write `(input_ids, loss_mask)` samples as one flat token shard; `attrs` adds provenance."""
    if len(samples) != len(sample_ids):
        raise ValueError(f"{len(samples)} samples but {len(sample_ids)} ids")
    lengths = np.array([len(ids) for ids, _ in samples], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    input_ids = np.concatenate([ids for ids, _ in samples]) if samples else np.zeros(0, np.int32)
    loss_mask = np.concatenate([m for _, m in samples]) if samples else np.zeros(0, np.uint8)
    with atomic_dir(path) as tmp:
        group = zarr.open_group(tmp, mode="w", zarr_format=3)
        for name, data, dtype in (
            ("input_ids", input_ids, np.int32),
            ("loss_mask", loss_mask, np.uint8),
            ("sample_offsets", offsets, np.int64),
        ):
            array = group.create_array(
                name, shape=data.shape, dtype=dtype, chunks=(max(1, min(len(data), 1 << 20)),)
            )
            if len(data):
                array[:] = data.astype(dtype, copy=False)
        group.attrs.update(
            {
                **dict(attrs),
                "format": TOKENS_FORMAT,
                "num_samples": len(samples),
                "num_tokens": int(offsets[-1]),
                "sample_ids": list(sample_ids),
            }
        )


class HiddenStoreWriter:
    """Fill a hidden store sample by sample, in any order, writing only whole chunks.

    Rows are buffered per chunk until every row of that chunk has arrived, so each chunk is encoded
    and written exactly once, by one writer: two writers of one chunk would race on its file.
    Memory holds only the chunks that are partly filled.

    zarr creates the arrays' metadata; chunks are then encoded with the arrays' own Blosc settings
    and written straight to their keys (`{array}/c/{i}/0`, byte-identical to what zarr writes, see
    tests/test_store.py). zarr's own write path runs every chunk through its event loop holding the
    GIL, which starved the thread driving the GPU (bench/results/extract-h200-*.json). `submit`
    decides where a chunk is written: inline by default, on a thread pool during extraction.

    With `chunks_per_shard` > 1 the arrays are zarr v3 sharded: `chunks_per_shard` chunks a file
    (`{array}/c/{shard}/0`, `shard_pieces`), and the shard is the unit buffered and written (what is
    said of chunks here and in `write_chunk`'s name then holds for shards). Reads keep the chunk's
    size; the files are that many times fewer, and each file cost the SGLang capture (its writer
    threads run beside the engine's scheduler) more than its bytes
    (bench/results/extraction-chunks-h100-smollm2.json).
    """

    def __init__(
        self,
        tmp_path: Path,
        sample_offsets: np.ndarray,
        hidden_size: int,
        num_taps: int,
        attrs: Mapping,
        chunk_tokens: int = CHUNK_TOKENS,
        storage: str = "bf16",
        chunks_per_shard: int = 1,
        compression: str = "zstd",
    ):
        if chunk_tokens < 1 or chunks_per_shard < 1:
            raise ValueError(
                f"chunk_tokens and chunks_per_shard must be >= 1, got {chunk_tokens}, {chunks_per_shard}"
            )
        self.offsets = np.asarray(sample_offsets, dtype=np.int64)
        self.num_tokens = int(self.offsets[-1])
        self.chunk_tokens = chunk_tokens
        self.storage = check_storage(storage)
        layout = hidden_layout(storage, hidden_size, num_taps)
        self.widths = {name: width for name, (width, _) in layout.items()}
        self.dtypes = {name: dtype for name, (_, dtype) in layout.items()}
        self.root = Path(tmp_path)
        self.group = zarr.open_group(tmp_path, mode="w", zarr_format=3)
        encodings = {name: "scale" if name == "scale" else storage for name in layout}
        self.arrays = {
            name: self.group.create_array(
                name,
                shape=(self.num_tokens, width),
                dtype=dtype,
                chunks=(chunk_tokens, width),
                shards=(chunk_tokens * chunks_per_shard, width) if chunks_per_shard > 1 else None,
                compressors=[hidden_codec(encodings[name], compression)],
                fill_value=0,
            )
            for name, (width, dtype) in layout.items()
        }
        self.encoders = {name: chunk_encoder(enc, compression) for name, enc in encodings.items()}
        self.submit: Callable[..., None] = lambda fn, *args: fn(*args)
        offsets = self.group.create_array(
            "sample_offsets", shape=self.offsets.shape, dtype=np.int64, chunks=self.offsets.shape
        )
        offsets[:] = self.offsets
        self.attrs = {
            **dict(attrs),
            "format": HIDDEN_FORMAT,
            "num_samples": len(self.offsets) - 1,
            "num_tokens": self.num_tokens,
            "num_taps": num_taps,
            "hidden_size": hidden_size,
            "dtype": STORED_DTYPES[storage],
            "storage": storage,
            "codec": codec_name(storage, compression),
            "compression": compression,
            "chunk_tokens": chunk_tokens,
            "chunks_per_shard": chunks_per_shard,
            **({"scale_rule": SCALE_RULE} if storage == "fp8_e4m3" else {}),
        }
        self.chunks_per_shard = chunks_per_shard
        # What is buffered and written whole: a chunk, or in a sharded store a shard (its chunks
        # encoded and written together, so the Python work a row costs is that of one large chunk).
        self.unit_tokens = chunk_tokens * chunks_per_shard
        self._pending: dict[int, dict[str, np.ndarray]] = {}
        self.peak_pending_chunks = 0  # memory held in partly filled chunks (shards), at its highest
        self._filled: dict[int, int] = {}
        self._written = np.zeros(len(self.offsets) - 1, dtype=bool)  # complete samples
        self._rows_written = np.zeros(len(self.offsets) - 1, dtype=np.int64)

    def _unit_rows(self, unit: int) -> int:
        return min(self.unit_tokens, self.num_tokens - unit * self.unit_tokens)

    def write_sample(
        self, index: int, aux: np.ndarray, final: np.ndarray, scale: np.ndarray | None = None
    ) -> None:
        """bf16: aux [T, K*H] and final [T, H] uint16 (bf16 bits).
        fp8_e4m3: the same shapes in uint8 (e4m3 bits) and scale [T, K+1] float32."""
        length = int(self.offsets[index + 1] - self.offsets[index])
        if self._written[index] or self._rows_written[index]:
            raise ValueError(f"sample {index} written twice")
        if len(aux) != length:
            raise ValueError(f"sample {index}: {len(aux)} rows given, expected {length} (its tokens)")
        self.write_rows(index, 0, aux, final, scale)

    def write_rows(
        self, index: int, start: int, aux: np.ndarray, final: np.ndarray, scale: np.ndarray | None = None
    ) -> bool:
        """Rows [start, start + n) of sample `index` (a chunked-prefill piece); the pieces of a sample
        must arrive in order. Returns True once the sample is complete."""
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        done = int(self._rows_written[index])
        n = len(aux)
        if self._written[index]:
            raise ValueError(f"sample {index} is complete; rows [{start}, {start + n}) came again")
        if start != done or lo + start + n > hi:
            raise ValueError(
                f"sample {index}: rows [{start}, {start + n}) given after {done} of its {hi - lo} rows "
                "(pieces must be contiguous, in order, within the sample)"
            )
        rows_of = {"aux": aux, "final": final}
        if "scale" in self.widths:
            rows_of["scale"] = scale
        elif scale is not None:
            raise ValueError(f"sample {index}: a scale was given to a {self.storage} store")
        for name, rows in rows_of.items():
            want = (n, self.widths[name])
            if rows is None or rows.shape != want or rows.dtype != self.dtypes[name]:
                got = None if rows is None else (rows.shape, rows.dtype)
                raise ValueError(
                    f"sample {index}: {name} is {got}, expected {want} {np.dtype(self.dtypes[name])}"
                )
        self._rows_written[index] = done + n
        self._written[index] = lo + done + n == hi
        start, stop_at = lo + done, lo + done + n
        while start < stop_at:
            chunk = start // self.unit_tokens
            chunk_lo = chunk * self.unit_tokens
            stop = min(stop_at, chunk_lo + self._unit_rows(chunk))
            if chunk not in self._pending:
                # zarr v3 stores an edge chunk at full size, padded with the fill value (0).
                alloc = np.empty if self._unit_rows(chunk) == self.unit_tokens else np.zeros
                self._pending[chunk] = {
                    n: alloc((self.unit_tokens, w), self.dtypes[n]) for n, w in self.widths.items()
                }
                self._filled[chunk] = 0
                self.peak_pending_chunks = max(self.peak_pending_chunks, len(self._pending))
            buffers = self._pending[chunk]
            for name, rows in rows_of.items():
                buffers[name][start - chunk_lo : stop - chunk_lo] = rows[start - lo - done : stop - lo - done]
            self._filled[chunk] += stop - start
            if self._filled[chunk] == self._unit_rows(chunk):
                self._flush(chunk)
            start = stop
        return bool(self._written[index])

    def _flush(self, chunk: int) -> None:
        buffers = self._pending.pop(chunk)
        del self._filled[chunk]
        for name, data in buffers.items():
            self.submit(self.write_chunk, name, chunk, data)

    def write_chunk(self, name: str, unit: int, data: np.ndarray) -> None:
        """Encode one whole chunk [chunk_tokens, width] and write it to its key; in a sharded store,
        one whole shard [chunk_tokens * chunks_per_shard, width]: its chunks inside the array, each
        encoded, in one file."""
        if self.chunks_per_shard == 1:
            self._write_file(name, unit, self._encode(name, data))
            return
        size = self.chunk_tokens
        inside = -(-self._unit_rows(unit) // size)  # the last shard's chunks past the end stay empty
        parts = {i: self._encode(name, data[i * size : (i + 1) * size]) for i in range(inside)}
        self._write_file(name, unit, *shard_pieces(parts, self.chunks_per_shard))

    def _encode(self, name: str, data: np.ndarray) -> bytes:
        return self.encoders[name].encode(np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")))

    def _write_file(self, name: str, key: int, *pieces: bytes) -> None:
        path = self.root / name / "c" / str(key) / "0"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.writelines(pieces)

    @property
    def pending_chunks(self) -> int:
        return len(self._pending)

    def finish(self, extra_attrs: Mapping | None = None) -> None:
        missing = np.flatnonzero(~self._written)
        if len(missing) or self._pending:
            raise RuntimeError(
                f"hidden store incomplete: {len(missing)} samples never written "
                f"(first: {missing[:5].tolist()}), {len(self._pending)} partial chunks"
            )
        self.group.attrs.update({**self.attrs, **dict(extra_attrs or {})})


def shard_pieces(parts: Mapping[int, bytes], chunks_per_shard: int) -> list[bytes]:
    """One zarr v3 shard (`sharding_indexed`, index at the end), as the pieces of its file in order:
    the encoded inner chunks, then the index [chunks_per_shard, 2] of (offset, nbytes) as
    little-endian uint64 (SHARD_EMPTY twice for an inner chunk past the array's end) followed by its
    crc32c as a little-endian uint32 (zarr's default index codecs: bytes, crc32c; zarr-specs
    sharding-indexed v1.0). Written piece by piece, the chunks are never copied into one buffer."""
    index = np.full((chunks_per_shard, 2), SHARD_EMPTY, dtype="<u8")
    offset = 0
    for inner in sorted(parts):
        index[inner] = (offset, len(parts[inner]))
        offset += len(parts[inner])
    index_bytes = index.tobytes()
    crc = np.uint32(google_crc32c.value(index_bytes)).astype("<u4").tobytes()
    return [*(parts[inner] for inner in sorted(parts)), index_bytes + crc]


@contextlib.contextmanager
def hidden_store_writer(
    path: str | os.PathLike,
    sample_offsets: np.ndarray,
    hidden_size: int,
    num_taps: int,
    attrs: Mapping,
    chunk_tokens: int = CHUNK_TOKENS,
    storage: str = "bf16",
    chunks_per_shard: int = 1,
    compression: str = "zstd",
) -> Iterator[HiddenStoreWriter]:
    """Context manager: the store appears at `path` only if the block completes and every sample
    was written. `chunks_per_shard` > 1 writes that many chunks to one file (zarr v3 sharding);
    `compression` `none` writes Blosc's uncompressed frames (`eyas.store.layout.blosc_settings`)."""
    with atomic_dir(path) as tmp:
        writer = HiddenStoreWriter(
            tmp, sample_offsets, hidden_size, num_taps, attrs, chunk_tokens, storage, chunks_per_shard,
            compression,
        )  # fmt: skip
        yield writer
        writer.finish()
