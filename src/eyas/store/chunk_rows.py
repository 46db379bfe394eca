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

    def _encoded(self, index: int) -> bytes | None:
        try:
            return (self.path / "c" / str(index) / "0").read_bytes()
        except FileNotFoundError:  # never written: zarr's fill value
            return None

    def _check_size(self, index: int, nbytes: int) -> None:
        expected = self.chunk_rows * self.width * self.dtype.itemsize
        if nbytes != expected:
            path = self.path / "c" / str(index) / "0"
            raise ValueError(f"{path}: decodes to {nbytes} bytes, expected {expected}")

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
