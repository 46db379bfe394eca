"""Zarr I/O for token shards and hidden-state stores (formats in docs/design.md).

Both are zarr v3 groups written through `atomic_dir`, so a store that exists is complete. Hidden
states are ragged and token-major: sample `s` owns rows `[offsets[s], offsets[s+1])` of every array.
bf16 lives on disk as a uint16 view because zarr-python 3 has no bfloat16 dtype.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zarr
from zarr.codecs import BloscCodec

from eyas.atomic import atomic_dir

TOKENS_FORMAT = "eyas.tokens/1"
HIDDEN_FORMAT = "eyas.hidden/1"
CHUNK_TOKENS = 256  # FACTS §2: whole-sample random reads match per-sample files at 256-token chunks
CODEC_NAME = "blosc:zstd:clevel=1:shuffle=byte:typesize=2:blocksize=1MiB"


class ProvenanceError(ValueError):
    """A store was made from a different model, tokenizer, template or layer set than expected."""


def hidden_codec() -> BloscCodec:
    # FACTS §2: a 1 MiB block lets zstd see whole exponent runs: ratio 1.42 vs 1.22 at Blosc's default.
    return BloscCodec(cname="zstd", clevel=1, shuffle="shuffle", typesize=2, blocksize=1 << 20)


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
    """

    def __init__(
        self,
        tmp_path: Path,
        sample_offsets: np.ndarray,
        hidden_size: int,
        num_taps: int,
        attrs: Mapping,
        chunk_tokens: int = CHUNK_TOKENS,
    ):
        self.offsets = np.asarray(sample_offsets, dtype=np.int64)
        self.num_tokens = int(self.offsets[-1])
        self.chunk_tokens = chunk_tokens
        self.widths = {"aux": num_taps * hidden_size, "final": hidden_size}
        self.group = zarr.open_group(tmp_path, mode="w", zarr_format=3)
        self.arrays = {
            name: self.group.create_array(
                name,
                shape=(self.num_tokens, width),
                dtype=np.uint16,
                chunks=(chunk_tokens, width),
                compressors=[hidden_codec()],
                fill_value=0,
            )
            for name, width in self.widths.items()
        }
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
            "dtype": "bfloat16",
            "codec": CODEC_NAME,
            "chunk_tokens": chunk_tokens,
        }
        self._pending: dict[int, dict[str, np.ndarray]] = {}
        self._filled: dict[int, int] = {}
        self._written = np.zeros(len(self.offsets) - 1, dtype=bool)

    def _chunk_rows(self, chunk: int) -> int:
        return min(self.chunk_tokens, self.num_tokens - chunk * self.chunk_tokens)

    def write_sample(self, index: int, aux: np.ndarray, final: np.ndarray) -> None:
        """aux: [T, K*H] uint16 (bf16 bits); final: [T, H] uint16."""
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        if self._written[index]:
            raise ValueError(f"sample {index} written twice")
        for name, rows in (("aux", aux), ("final", final)):
            if rows.shape != (hi - lo, self.widths[name]) or rows.dtype != np.uint16:
                raise ValueError(
                    f"sample {index}: {name} has shape {rows.shape} {rows.dtype}, "
                    f"expected {(hi - lo, self.widths[name])} uint16"
                )
        self._written[index] = True
        start = lo
        while start < hi:
            chunk = start // self.chunk_tokens
            chunk_lo = chunk * self.chunk_tokens
            stop = min(hi, chunk_lo + self._chunk_rows(chunk))
            if chunk not in self._pending:
                self._pending[chunk] = {
                    n: np.empty((self._chunk_rows(chunk), w), np.uint16) for n, w in self.widths.items()
                }
                self._filled[chunk] = 0
            buffers = self._pending[chunk]
            buffers["aux"][start - chunk_lo : stop - chunk_lo] = aux[start - lo : stop - lo]
            buffers["final"][start - chunk_lo : stop - chunk_lo] = final[start - lo : stop - lo]
            self._filled[chunk] += stop - start
            if self._filled[chunk] == self._chunk_rows(chunk):
                self._flush(chunk)
            start = stop

    def _flush(self, chunk: int) -> None:
        buffers = self._pending.pop(chunk)
        del self._filled[chunk]
        lo = chunk * self.chunk_tokens
        for name, data in buffers.items():
            self.arrays[name][lo : lo + len(data)] = data

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
) -> Iterator[HiddenStoreWriter]:
    """Context manager: the store appears at `path` only if the block completes and every sample
    was written."""
    with atomic_dir(path) as tmp:
        writer = HiddenStoreWriter(tmp, sample_offsets, hidden_size, num_taps, attrs, chunk_tokens)
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
        self.aux = self.group["aux"]
        self.final = self.group["final"]
        self.sample_offsets = self.group["sample_offsets"][:]

    @property
    def num_samples(self) -> int:
        return len(self.sample_offsets) - 1

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [T, K*H], final [T, H]) as bf16 tensors."""
        lo, hi = int(self.sample_offsets[index]), int(self.sample_offsets[index + 1])
        return uint16_to_bf16(self.aux[lo:hi]), uint16_to_bf16(self.final[lo:hi])


def check_provenance(attrs: Mapping, expected: Mapping, where: str | os.PathLike) -> None:
    """Raise `ProvenanceError` naming the first field whose stored value differs from `expected`."""
    for field, want in expected.items():
        have = attrs.get(field)
        if isinstance(want, tuple):
            want = list(want)
        if have != want:
            raise ProvenanceError(f"{where}: provenance field {field!r} is {have!r}, expected {want!r}")
