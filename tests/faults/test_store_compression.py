"""`extract.compression: none`: Blosc's uncompressed frames. zarr reads them, the direct reader reads
them as it reads compressed chunks, sharded or not, the values equal the compressed store's, the files
hold the raw bytes (within the disk pre-flight's estimate), and extraction and validation take them."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from faultkit import EXTRACT_KW, random_store_rows

from eyas.store import HiddenStore, hidden_store_writer
from eyas.store.chunk_rows import direct_readable
from eyas.store.layout import blosc_settings, codec_name
from eyas.store.size import estimated_store_bytes

LENGTHS, HIDDEN, TAPS, CHUNK = (40, 0, 3, 100, 17), 32, 3, 24  # 160 tokens: 7 chunks, an edge chunk


def _rows(storage: str):
    return random_store_rows(storage, sum(LENGTHS), TAPS, HIDDEN)


def _write(path, storage: str, compression: str, chunks_per_shard: int, rows) -> None:
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    aux, final, scale = rows
    with hidden_store_writer(
        path, offsets, HIDDEN, TAPS, {}, CHUNK, storage, chunks_per_shard, compression
    ) as writer:
        for i in range(len(LENGTHS)):
            lo, hi = offsets[i], offsets[i + 1]
            writer.write_sample(i, aux[lo:hi], final[lo:hi], *(() if scale is None else (scale[lo:hi],)))


def _bytes(store) -> int:
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file() and "/c/" in p.as_posix())


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("chunks_per_shard", [1, 3])
def test_uncompressed_stores_read_back_as_compressed_ones(tmp_path, storage, chunks_per_shard):
    rows = _rows(storage)
    _write(tmp_path / "z.zarr", storage, "zstd", chunks_per_shard, rows)
    _write(tmp_path / "n.zarr", storage, "none", chunks_per_shard, rows)
    zstd, none = HiddenStore(tmp_path / "z.zarr"), HiddenStore(tmp_path / "n.zarr")
    assert none.attrs["compression"] == "none" and none.attrs["codec"] == codec_name(storage, "none")
    assert zstd.attrs["compression"] == "zstd" and zstd.attrs["codec"] == codec_name(storage)
    names = ("aux", "final", "scale") if storage == "fp8_e4m3" else ("aux", "final")
    raw = zarr.open_group(tmp_path / "n.zarr", mode="r")
    total = sum(LENGTHS)
    for name in names:
        assert direct_readable(getattr(none, name))
        assert np.array_equal(raw[name][:], zstd.stored_rows(name, 0, total))  # zarr's own read
        for lo, hi in [(0, total), (23, 25), (47, 96), (150, total)]:
            assert np.array_equal(none.stored_rows(name, lo, hi), zstd.stored_rows(name, lo, hi))
    raw_values = total * (TAPS + 1) * HIDDEN * (2 if storage == "bf16" else 1)
    assert _bytes(tmp_path / "n.zarr") >= raw_values  # stored as they are
    assert _bytes(tmp_path / "n.zarr") <= estimated_store_bytes(total, HIDDEN, TAPS + 1, storage, "none")


def test_unknown_compression_refused_naming_the_choices():
    with pytest.raises(ValueError, match="compression 'lz5': expected one of zstd, none"):
        blosc_settings("bf16", "lz5")
    assert blosc_settings("fp8_e4m3", "none")["clevel"] == 0 and blosc_settings("fp8_e4m3")["clevel"] == 1


def test_extraction_and_validation_take_uncompressed_stores(tmp_path, token_shard_path, tiny_model_dir):
    """The HF backend with compression none writes the same states, as raw bytes; validation passes it."""
    from eyas.extract.hf_backend import extract_shard
    from eyas.validate import validate_store

    zstd, none = tmp_path / "z.zarr", tmp_path / "n.zarr"
    extract_shard(str(token_shard_path), str(zstd), str(tiny_model_dir), **EXTRACT_KW)
    extract_shard(str(token_shard_path), str(none), str(tiny_model_dir), compression="none", **EXTRACT_KW)
    a, b = HiddenStore(zstd), HiddenStore(none)
    assert b.attrs["compression"] == "none"
    for name in ("aux", "final"):
        assert np.array_equal(a.stored_rows(name, 0, a.aux.shape[0]), b.stored_rows(name, 0, b.aux.shape[0]))
    assert _bytes(none) > _bytes(zstd)
    assert validate_store(token_shard_path, none)["ok"]
