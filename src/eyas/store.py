"""Zarr I/O for token shards and hidden-state stores (formats in docs/design.md).

Both are zarr v3 groups written through `atomic_dir`, so a store that exists is complete. Hidden
states are ragged and token-major: sample `s` owns rows `[offsets[s], offsets[s+1])` of every array.
bf16 lives on disk as a uint16 view because zarr-python 3 has no bfloat16 dtype.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np
import torch
import zarr
from zarr.codecs import BloscCodec

from eyas.atomic import atomic_dir
from eyas.chunk_rows import ChunkRows, direct_readable
from eyas.quant import SCALE_RULE, check_storage, fp8_dequantize

TOKENS_FORMAT = "eyas.tokens/1"
HIDDEN_FORMAT = "eyas.hidden/1"
CHUNK_TOKENS = 256  # FACTS §2 + bench/chunks.py: whole-sample random reads match per-sample files
CODEC_NAMES = {
    "bf16": "blosc:zstd:clevel=1:shuffle=byte:typesize=2:blocksize=1MiB",
    "fp8_e4m3": "blosc:zstd:clevel=1:shuffle=bit:typesize=1:blocksize=1MiB (scale: float32, byte shuffle)",
}
STORED_DTYPES = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn"}


class ProvenanceError(ValueError):
    """A store was made from a different model, tokenizer, template or layer set than expected."""


# Blosc settings per on-disk encoding. FACTS §2: a 1 MiB block lets zstd see whole exponent runs
# (ratio 1.42 vs 1.22 at Blosc's default block); fp8 bytes hold sign, 4 exponent and 3 mantissa bits,
# so bit planes separate the compressible exponent; scales are float32.
BLOSC_SETTINGS = {
    "bf16": {"cname": "zstd", "clevel": 1, "shuffle": "shuffle", "typesize": 2, "blocksize": 1 << 20},
    "fp8_e4m3": {"cname": "zstd", "clevel": 1, "shuffle": "bitshuffle", "typesize": 1, "blocksize": 1 << 20},
    "scale": {"cname": "zstd", "clevel": 1, "shuffle": "shuffle", "typesize": 4, "blocksize": 1 << 20},
}
_NUMCODECS_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def hidden_codec(encoding: str = "bf16") -> BloscCodec:
    """The zarr codec of an array with this encoding (`bf16`, `fp8_e4m3` or `scale`)."""
    return BloscCodec(**BLOSC_SETTINGS[encoding])


def chunk_encoder(encoding: str) -> numcodecs.Blosc:
    """The same Blosc as `hidden_codec`, called directly: it releases the GIL while compressing."""
    settings = dict(BLOSC_SETTINGS[encoding])
    settings["shuffle"] = _NUMCODECS_SHUFFLE[settings["shuffle"]]
    return numcodecs.Blosc(**settings)


def hidden_layout(storage: str, hidden_size: int, num_taps: int) -> dict[str, tuple[int, type]]:
    """Token-major arrays of a hidden store: name -> (row width, numpy dtype on disk)."""
    if check_storage(storage) == "bf16":
        return {"aux": (num_taps * hidden_size, np.uint16), "final": (hidden_size, np.uint16)}
    return {
        "aux": (num_taps * hidden_size, np.uint8),
        "final": (hidden_size, np.uint8),
        "scale": (num_taps + 1, np.float32),  # taps in layer_ids order, then the final state
    }


def bf16_to_uint16(tensor: torch.Tensor) -> np.ndarray:
    """Round to bf16 (if needed) and return the raw bits as a uint16 numpy array (CPU)."""
    return tensor.detach().to(torch.bfloat16).cpu().contiguous().view(torch.uint16).numpy()


def uint16_to_bf16(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint16)).view(torch.bfloat16)


# --------------------------------------------------------------------------- token shards
@dataclass
class TokenShard:
    input_ids: np.ndarray  # [N] int32
    loss_mask: np.ndarray  # [N] uint8
    sample_offsets: np.ndarray  # [S+1] int64
    attrs: dict

    @property
    def num_samples(self) -> int:
        return len(self.sample_offsets) - 1

    def sample(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.sample_offsets[index], self.sample_offsets[index + 1]
        return self.input_ids[lo:hi], self.loss_mask[lo:hi]


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


def read_token_shard(path: str | os.PathLike) -> TokenShard:
    group = zarr.open_group(Path(path), mode="r")
    attrs = dict(group.attrs)
    if attrs.get("format") != TOKENS_FORMAT:
        raise ProvenanceError(f"{path}: not an eyas token shard (format={attrs.get('format')!r})")
    return TokenShard(
        input_ids=group["input_ids"][:],
        loss_mask=group["loss_mask"][:],
        sample_offsets=group["sample_offsets"][:],
        attrs=attrs,
    )


# --------------------------------------------------------------------------- hidden stores
class HiddenStoreWriter:
    """Fill a hidden store sample by sample, in any order, writing only whole chunks.

    Rows are buffered per chunk until every row of that chunk has arrived, so each chunk is encoded
    and written exactly once (FACTS §2: one writer per chunk range, whole chunks only). Memory holds
    only the chunks that are partly filled.

    zarr creates the arrays' metadata; chunks are then encoded with the arrays' own Blosc settings
    and written straight to their keys (`{array}/c/{i}/0`, byte-identical to what zarr writes, see
    tests/test_store.py). zarr's own write path runs every chunk through its event loop holding the
    GIL, which starved the thread driving the GPU (bench/results/extract-h200-*.json). `submit`
    decides where a chunk is written: inline by default, on a thread pool during extraction.
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
    ):
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
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
                compressors=[hidden_codec(encodings[name])],
                fill_value=0,
            )
            for name, (width, dtype) in layout.items()
        }
        self.encoders = {name: chunk_encoder(encoding) for name, encoding in encodings.items()}
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
            "codec": CODEC_NAMES[storage],
            "chunk_tokens": chunk_tokens,
            **({"scale_rule": SCALE_RULE} if storage == "fp8_e4m3" else {}),
        }
        self._pending: dict[int, dict[str, np.ndarray]] = {}
        self.peak_pending_chunks = 0  # memory held in partly filled chunks, at its highest
        self._filled: dict[int, int] = {}
        self._written = np.zeros(len(self.offsets) - 1, dtype=bool)  # complete samples
        self._rows_written = np.zeros(len(self.offsets) - 1, dtype=np.int64)

    def _chunk_rows(self, chunk: int) -> int:
        return min(self.chunk_tokens, self.num_tokens - chunk * self.chunk_tokens)

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
            chunk = start // self.chunk_tokens
            chunk_lo = chunk * self.chunk_tokens
            stop = min(stop_at, chunk_lo + self._chunk_rows(chunk))
            if chunk not in self._pending:
                # zarr v3 stores an edge chunk at full size, padded with the fill value (0).
                alloc = np.empty if self._chunk_rows(chunk) == self.chunk_tokens else np.zeros
                self._pending[chunk] = {
                    n: alloc((self.chunk_tokens, w), self.dtypes[n]) for n, w in self.widths.items()
                }
                self._filled[chunk] = 0
                self.peak_pending_chunks = max(self.peak_pending_chunks, len(self._pending))
            buffers = self._pending[chunk]
            for name, rows in rows_of.items():
                buffers[name][start - chunk_lo : stop - chunk_lo] = rows[start - lo - done : stop - lo - done]
            self._filled[chunk] += stop - start
            if self._filled[chunk] == self._chunk_rows(chunk):
                self._flush(chunk)
            start = stop
        return bool(self._written[index])

    def _flush(self, chunk: int) -> None:
        buffers = self._pending.pop(chunk)
        del self._filled[chunk]
        for name, data in buffers.items():
            self.submit(self.write_chunk, name, chunk, data)

    def write_chunk(self, name: str, chunk: int, data: np.ndarray) -> None:
        """Encode one whole chunk [chunk_tokens, width] and write it to its key."""
        path = self.root / name / "c" / str(chunk) / "0"
        path.parent.mkdir(parents=True, exist_ok=True)
        encoded = self.encoders[name].encode(np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<")))
        with open(path, "wb") as fh:
            fh.write(encoded)

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


@contextlib.contextmanager
def hidden_store_writer(
    path: str | os.PathLike,
    sample_offsets: np.ndarray,
    hidden_size: int,
    num_taps: int,
    attrs: Mapping,
    chunk_tokens: int = CHUNK_TOKENS,
    storage: str = "bf16",
) -> Iterator[HiddenStoreWriter]:
    """Context manager: the store appears at `path` only if the block completes and every sample
    was written."""
    with atomic_dir(path) as tmp:
        writer = HiddenStoreWriter(tmp, sample_offsets, hidden_size, num_taps, attrs, chunk_tokens, storage)
        yield writer
        writer.finish()


class HiddenStore:
    """Read side of a hidden store. Open it inside each loader worker, not before a fork."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.group = zarr.open_group(self.path, mode="r")
        self.attrs = dict(self.group.attrs)
        if self.attrs.get("format") != HIDDEN_FORMAT:
            raise ProvenanceError(f"{path}: not an eyas hidden store (format={self.attrs.get('format')!r})")
        self.storage = self.attrs.get("storage", "bf16")  # stores before the fp8 option are bf16
        check_storage(self.storage)
        self.aux = self.group["aux"]
        self.final = self.group["final"]
        self.scale = self.group["scale"] if self.storage == "fp8_e4m3" else None
        self.sample_offsets = self.group["sample_offsets"][:]
        # Row readers: straight from the chunk files where the layout is eyas's own (parallel
        # across threads), else zarr's slicing.
        self._rows = {
            name: ChunkRows(array, self.path / name).rows if direct_readable(array) else _zarr_rows(array)
            for name, array in (("aux", self.aux), ("final", self.final), ("scale", self.scale))
            if array is not None
        }

    @property
    def num_samples(self) -> int:
        return len(self.sample_offsets) - 1

    @property
    def sample_dtype(self) -> torch.dtype:
        """What `sample` returns: bf16 from a bf16 store, float32 (dequantized) from an fp8 store."""
        return torch.bfloat16 if self.scale is None else torch.float32

    def sample_into(self, index: int, aux_out: torch.Tensor, final_out: torch.Tensor) -> None:
        """Sample `index` written into aux_out [T, K*H] and final_out [T, H] (contiguous CPU tensors,
        e.g. rows of a pinned batch). From a bf16 store into bf16 tensors, chunks decode straight
        into them; otherwise through `sample` and a copy."""
        lo, hi = int(self.sample_offsets[index]), int(self.sample_offsets[index + 1])
        direct = self.scale is None and aux_out.dtype == final_out.dtype == torch.bfloat16
        if not (direct and aux_out.is_contiguous() and final_out.is_contiguous()):
            aux, final = self.sample(index)
            aux_out.copy_(aux)
            final_out.copy_(final)
            return
        for name, out in (("aux", aux_out), ("final", final_out)):
            self._rows[name](lo, hi, out=out.view(torch.uint16).numpy())

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [T, K*H], final [T, H]): bf16 tensors from a bf16 store, float32 ones (dequantized)
        from an fp8 store."""
        lo, hi = int(self.sample_offsets[index]), int(self.sample_offsets[index + 1])
        rows = self._rows
        if self.scale is None:
            return uint16_to_bf16(rows["aux"](lo, hi)), uint16_to_bf16(rows["final"](lo, hi))
        scale = torch.from_numpy(rows["scale"](lo, hi))  # [T, K+1]
        aux = torch.from_numpy(rows["aux"](lo, hi))  # [T, K*H] uint8
        final = torch.from_numpy(rows["final"](lo, hi))  # [T, H] uint8
        taps = scale.shape[1] - 1
        width = self.aux.shape[1] // taps  # explicit: a zero-length sample has no -1 to infer
        aux = fp8_dequantize(aux.view(hi - lo, taps, width), scale[:, :taps]).reshape(hi - lo, taps * width)
        return aux, fp8_dequantize(final, scale[:, taps])


def _zarr_rows(array: zarr.Array) -> Callable[..., np.ndarray]:
    def rows(lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return array[lo:hi]
        out[...] = array[lo:hi]
        return out

    return rows


def list_hidden_stores(directory: str | os.PathLike, num_shards: int) -> tuple[list[Path], list[int]]:
    """The complete shard stores of one split, and the shard indices not (yet) there.

    Stores appear only when complete (atomic rename), so a reader can start on the shards that
    exist while extraction of the others is still running.
    """
    directory = Path(directory)
    present, missing = [], []
    for shard in range(num_shards):
        path = directory / f"shard-{shard:05d}.zarr"
        if (path / "zarr.json").exists():
            present.append(path)
        else:
            missing.append(shard)
    return present, missing


def check_provenance(attrs: Mapping, expected: Mapping, where: str | os.PathLike) -> None:
    """Raise `ProvenanceError` naming the first field whose stored value differs from `expected`."""
    for field, want in expected.items():
        have = attrs.get(field)
        if isinstance(want, tuple):
            want = list(want)
        if have != want:
            raise ProvenanceError(f"{where}: provenance field {field!r} is {have!r}, expected {want!r}")
