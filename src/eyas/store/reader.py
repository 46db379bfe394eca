"""The read side: token shards whole, hidden stores sample by sample (straight from the chunk files
where the layout is eyas's own), and the complete stores of a split."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zarr

from eyas.store.chunk_rows import ChunkRows, direct_readable
from eyas.store.layout import HIDDEN_FORMAT, TOKENS_FORMAT, ProvenanceError, shard_name, uint16_to_bf16
from eyas.store.quant import check_storage, fp8_dequantize


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
        arrays = {"aux": self.aux, "final": self.final, "scale": self.scale}
        self._direct = {
            name: ChunkRows(array, self.path / name)
            for name, array in arrays.items()
            if array is not None and direct_readable(array)
        }
        self._rows = {
            name: self._direct[name].rows if name in self._direct else _zarr_rows(array)
            for name, array in arrays.items()
            if array is not None
        }

    @property
    def num_samples(self) -> int:
        return len(self.sample_offsets) - 1

    def missing_chunks(self, name: str) -> int:
        """Chunks of array `name` with nothing on disk (they would read back as the fill value):
        zarr's count, but for shards read directly their own indexes, since zarr counts a partial last
        shard's chunks past the array's end as present. Raises ValueError for a damaged shard index."""
        array = getattr(self, name)
        if array.shards is None or name not in self._direct:
            return array.nchunks - array.nchunks_initialized
        return self._direct[name].missing_chunks()

    def stored_rows(self, name: str, lo: int, hi: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows [lo, hi) of array `name` ("aux", "final", "scale") as stored: bf16 and fp8 values as
        their bits (uint16, uint8), scales as float32. Given `out` (C-contiguous [hi - lo, width] of
        that dtype) they land there, whole chunks decoded straight into it. Safe to call from several
        threads at once."""
        return self._rows[name](lo, hi, out=out)

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

    def stored_sample_into(
        self, index: int, aux_out: torch.Tensor, final_out: torch.Tensor, scale_out: torch.Tensor
    ) -> None:
        """Sample `index` of an fp8 store as stored, chunks decoded straight into aux_out [T, K*H] and
        final_out [T, H] (uint8: e4m3 bits) and scale_out [T, K+1] (float32), contiguous CPU tensors:
        the bits are dequantized later, on the device (`eyas.train.loader.Batch.to`)."""
        if self.scale is None:
            raise ValueError(f"{self.path}: a {self.storage} store has no fp8 bits and scales")
        lo, hi = int(self.sample_offsets[index]), int(self.sample_offsets[index + 1])
        for name, out in (("aux", aux_out), ("final", final_out), ("scale", scale_out)):
            self._rows[name](lo, hi, out=out.numpy())

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
        path = directory / shard_name(shard)
        if (path / "zarr.json").exists():
            present.append(path)
        else:
            missing.append(shard)
    return present, missing
