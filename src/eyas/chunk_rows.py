"""Row reads of a hidden-store array straight from its chunk files: the read side of
`HiddenStoreWriter.write_chunk`.

zarr-python 3 routes every read of every thread through one asyncio event loop, so a trainer's
reader threads queue behind each other there (bench/train.py: 4 readers read no faster than 2).
Reading the chunk file and Blosc-decoding it in the calling thread releases the GIL for the decode,
so readers run in parallel. Only arrays laid out the way eyas writes them are read this way (2-D,
regular chunks, default `c/` keys, one Blosc compressor, little-endian bytes); anything else goes
through zarr.
"""

from __future__ import annotations

from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding


def direct_readable(array: zarr.Array) -> bool:
    """True when `array`'s chunks are plain Blosc frames at `c/<row chunk>/0` (what eyas writes)."""
    meta = array.metadata
    if getattr(meta, "zarr_format", None) != 3 or len(array.shape) != 2 or array.shards is not None:
        return False
    encoding = meta.chunk_key_encoding
    if not isinstance(encoding, DefaultChunkKeyEncoding) or encoding.separator != "/":
        return False
    serializer = array.serializer
    little = isinstance(serializer, BytesCodec) and (
        serializer.endian is None or serializer.endian.value == "little"
    )
    blosc = len(array.compressors) == 1 and isinstance(array.compressors[0], BloscCodec)
    return little and blosc and not array.filters and array.chunks[1] == array.shape[1]


class ChunkRows:
    """`rows(lo, hi)` of one array, [hi - lo, width], decoded chunk by chunk in the caller's thread."""

    def __init__(self, array: zarr.Array, path: str | Path):
        self.path = Path(path)
        self.num_rows, self.width = array.shape
        self.chunk_rows = array.chunks[0]
        self.dtype = np.dtype(array.dtype).newbyteorder("<")
        self.fill = array.metadata.fill_value
        self.blosc = numcodecs.Blosc()  # decoding reads its settings from each frame's header

    def chunk(self, index: int) -> np.ndarray:
        """Chunk `index` as [chunk_rows, width] (the edge chunk too: zarr stores it full size)."""
        path = self.path / "c" / str(index) / "0"
        try:
            encoded = path.read_bytes()
        except FileNotFoundError:  # never written: zarr's fill value
            return np.full((self.chunk_rows, self.width), self.fill, dtype=self.dtype)
        decoded = self.blosc.decode(encoded)
        expected = self.chunk_rows * self.width * self.dtype.itemsize
        if len(memoryview(decoded).cast("B")) != expected:
            raise ValueError(f"{path}: decodes to {len(decoded)} bytes, expected {expected}")
        return np.frombuffer(decoded, dtype=self.dtype).reshape(self.chunk_rows, self.width)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        if not 0 <= lo <= hi <= self.num_rows:
            raise IndexError(f"{self.path}: rows [{lo}, {hi}) outside [0, {self.num_rows})")
        out = np.empty((hi - lo, self.width), dtype=self.dtype)
        size = self.chunk_rows
        for index in range(lo // size, (hi + size - 1) // size):
            start, stop = max(lo, index * size), min(hi, (index + 1) * size)
            out[start - lo : stop - lo] = self.chunk(index)[start - index * size : stop - index * size]
        return out
