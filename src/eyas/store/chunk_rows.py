"""Row reads of a hidden-store array straight from its chunk files: the read side of
`HiddenStoreWriter.write_chunk`, sharded arrays (zarr v3 `sharding_indexed`, index at the end) too.

zarr-python 3 routes every read of every thread through one asyncio event loop, so a trainer's
reader threads queue behind each other there (bench/train.py: 4 readers read no faster than 2).
Reading the chunk file and Blosc-decoding it in the calling thread releases the GIL for the decode,
so readers run in parallel. Only arrays laid out the way eyas writes them are read this way (2-D,
regular chunks, default `c/` keys, one Blosc compressor, little-endian bytes; shards of whole rows
with the default index codecs); anything else goes through zarr.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import google_crc32c
import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ShardingCodecIndexLocation
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding

from eyas.store.layout import SHARD_EMPTY


def _little(codec) -> bool:
    return isinstance(codec, BytesCodec) and (codec.endian is None or codec.endian.value == "little")


def _plain_shards(array: zarr.Array) -> bool:
    """No shards, or shards of whole rows with the index at the end in bytes + crc32c (what eyas and
    zarr write by default)."""
    if array.shards is None:
        return True
    sharding = array.metadata.codecs[0]
    index = sharding.index_codecs if isinstance(sharding, ShardingCodec) else ()
    return (
        isinstance(sharding, ShardingCodec)
        and sharding.index_location == ShardingCodecIndexLocation.end
        and len(index) == 2
        and _little(index[0])
        and isinstance(index[1], Crc32cCodec)
        and array.shards[1] == array.shape[1]
        and array.shards[0] % array.chunks[0] == 0
    )


def direct_readable(array: zarr.Array) -> bool:
    """True when `array`'s chunks are plain Blosc frames at `c/<row chunk>/0`, or inside shard files
    at `c/<row shard>/0` (what eyas writes)."""
    meta = array.metadata
    if getattr(meta, "zarr_format", None) != 3 or len(array.shape) != 2 or not _plain_shards(array):
        return False
    encoding = meta.chunk_key_encoding
    if not isinstance(encoding, DefaultChunkKeyEncoding) or encoding.separator != "/":
        return False
    blosc = len(array.compressors) == 1 and isinstance(array.compressors[0], BloscCodec)
    return _little(array.serializer) and blosc and not array.filters and array.chunks[1] == array.shape[1]


class ChunkRows:
    """`rows(lo, hi)` of one array, [hi - lo, width], decoded chunk by chunk in the caller's thread."""

    def __init__(self, array: zarr.Array, path: str | Path):
        self.path = Path(path)
        self._chunks_dir = os.fspath(self.path / "c")
        self.num_rows, self.width = array.shape
        self.chunk_rows = array.chunks[0]
        self.dtype = np.dtype(array.dtype).newbyteorder("<")
        self.fill = array.metadata.fill_value
        self.blosc = numcodecs.Blosc()  # decoding reads its settings from each frame's header
        self.per_shard = array.shards[0] // self.chunk_rows if array.shards is not None else 0
        self._indexes: dict[int, np.ndarray | None] = {}  # shard -> [per_shard, 2] (offset, nbytes)
        self._lock = threading.Lock()

    def _file(self, key: int) -> str:
        """The file of chunk `key`, or of shard `key` in a sharded array. A string: joining Paths took
        ~9 us a chunk under the GIL, more than the rest of a chunk's Python (~6 us); reader threads
        queue on it."""
        return f"{self._chunks_dir}/{key}/0"

    def _where(self, index: int) -> str:
        if not self.per_shard:
            return self._file(index)
        shard, inner = divmod(index, self.per_shard)
        return f"{self._file(shard)} (inner chunk {inner})"

    def _shard_index(self, shard: int) -> np.ndarray | None:
        """The shard's index, read once from the file's end and its crc32c checked; None if no file."""
        path = self._file(shard)
        with self._lock:
            if shard in self._indexes:
                return self._indexes[shard]
        nbytes = self.per_shard * 16 + 4
        try:
            with open(path, "rb") as fh:
                fh.seek(-nbytes, 2)
                tail = fh.read(nbytes)
        except FileNotFoundError:
            index = None
        except OSError as err:  # shorter than an index
            raise ValueError(f"{path}: not a shard of {self.per_shard} chunks ({err})") from err
        else:
            body, crc = tail[:-4], int.from_bytes(tail[-4:], "little")
            if google_crc32c.value(body) != crc:
                raise ValueError(f"{path}: the shard index fails its crc32c (a damaged file)")
            index = np.frombuffer(body, dtype="<u8").reshape(self.per_shard, 2)
        with self._lock:
            self._indexes[shard] = index
        return index

    def _encoded(self, index: int) -> bytes | None:
        if not self.per_shard:
            try:
                with open(self._file(index), "rb") as fh:
                    return fh.read()
            except FileNotFoundError:  # never written: zarr's fill value
                return None
        shard, inner = divmod(index, self.per_shard)
        path = self._file(shard)
        shard_index = self._shard_index(shard)
        if shard_index is None:
            return None
        offset, nbytes = (int(v) for v in shard_index[inner])
        if offset == SHARD_EMPTY and nbytes == SHARD_EMPTY:
            return None
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.pread(fd, nbytes, offset)
        finally:
            os.close(fd)

    def missing_chunks(self) -> int:
        """Chunks of a sharded array's extent that no shard holds (a shard file gone, or an index
        entry left empty): they would read back as the fill value. zarr's `nchunks_initialized`
        counts a partial last shard's chunks past the array's end as present."""
        if not self.per_shard:
            raise ValueError(f"{self.path}: not sharded")
        chunks = -(-self.num_rows // self.chunk_rows)
        missing = 0
        for shard in range(-(-chunks // self.per_shard)):
            inside = min(self.per_shard, chunks - shard * self.per_shard)
            index = self._shard_index(shard)
            if index is None:
                missing += inside
            else:
                missing += int(np.count_nonzero((index[:inside] == SHARD_EMPTY).all(axis=1)))
        return missing

    def _check_size(self, index: int, nbytes: int) -> None:
        expected = self.chunk_rows * self.width * self.dtype.itemsize
        if nbytes != expected:
            raise ValueError(f"{self._where(index)}: decodes to {nbytes} bytes, expected {expected}")

    def chunk(self, index: int) -> np.ndarray:
        """Chunk `index` as [chunk_rows, width] (the edge chunk too: zarr stores it full size)."""
        encoded = self._encoded(index)
        if encoded is None:
            return np.full((self.chunk_rows, self.width), self.fill, dtype=self.dtype)
        decoded = self.blosc.decode(encoded)
        self._check_size(index, len(memoryview(decoded).cast("B")))
        return np.frombuffer(decoded, dtype=self.dtype).reshape(self.chunk_rows, self.width)

    def _decode_into(self, index: int, dest: np.ndarray) -> None:
        """Whole chunk `index` decoded straight into `dest` [chunk_rows, width] (C-contiguous)."""
        encoded = self._encoded(index)
        if encoded is None:
            dest[...] = self.fill
            return
        # Blosc frame header: bytes 4-7 hold the decoded size (little-endian uint32).
        self._check_size(index, int.from_bytes(encoded[4:8], "little") if len(encoded) >= 16 else -1)
        self.blosc.decode(encoded, out=dest)

    def rows(self, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [lo, hi) as [hi - lo, width]. Given `out` (that shape and dtype, C-contiguous, e.g. a
        row range of a pinned batch), they land there, whole chunks decoded straight into it: one
        pass over the bytes instead of decode, gather and copy."""
        if not 0 <= lo <= hi <= self.num_rows:
            raise IndexError(f"{self.path}: rows [{lo}, {hi}) outside [0, {self.num_rows})")
        if out is None:
            out = np.empty((hi - lo, self.width), dtype=self.dtype)
        elif out.shape != (hi - lo, self.width) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"{self.path}: out is {out.shape} {out.dtype}, expected C-contiguous "
                f"{(hi - lo, self.width)} {self.dtype}"
            )
        size = self.chunk_rows
        for index in range(lo // size, (hi + size - 1) // size):
            start, stop = max(lo, index * size), min(hi, (index + 1) * size)
            if stop - start == size:
                self._decode_into(index, out[start - lo : stop - lo])
            else:
                out[start - lo : stop - lo] = self.chunk(index)[start - index * size : stop - index * size]
        return out
