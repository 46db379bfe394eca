"""Sharded hidden stores (`extract.chunks_per_shard` > 1): several chunks in one zarr v3 shard file.
zarr itself must read what eyas writes (shard files byte-identical to its own), the direct reader
must read what zarr writes, a damaged shard index is refused naming its file, and extraction and
validation take the layout end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr
from faultkit import EXTRACT_KW, random_store_rows

from eyas.store import HiddenStore, hidden_store_writer
from eyas.store.chunk_rows import direct_readable

LENGTHS, HIDDEN, TAPS, CHUNK = (40, 0, 3, 100, 17), 8, 3, 24  # 160 tokens: 7 chunks, an edge chunk


def _rows(storage: str):
    return random_store_rows(storage, sum(LENGTHS), TAPS, HIDDEN)


def _write(path, storage: str, chunks_per_shard: int, rows) -> None:
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    aux, final, scale = rows
    with hidden_store_writer(path, offsets, HIDDEN, TAPS, {}, CHUNK, storage, chunks_per_shard) as writer:
        for i in reversed(range(len(LENGTHS))):  # any order: shards complete out of order
            lo, hi = offsets[i], offsets[i + 1]
            writer.write_sample(i, aux[lo:hi], final[lo:hi], *(() if scale is None else (scale[lo:hi],)))


def _chunk_files(array_dir) -> list:
    """The chunk (or shard) files of an array: `c/<i>/0`, in key order."""
    return sorted((p for p in (array_dir / "c").glob("*/0") if p.is_file()), key=lambda p: int(p.parent.name))


def _names(storage: str) -> tuple[str, ...]:
    return ("aux", "final", "scale") if storage == "fp8_e4m3" else ("aux", "final")


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_shard_files_equal_zarrs_own(tmp_path, storage):
    """3 chunks a shard: files for shards 0, 1 (full) and 2 (one chunk, two past the end), each
    byte-identical to the file zarr writes for the same rows and layout."""
    rows = _rows(storage)
    _write(tmp_path / "h.zarr", storage, 3, rows)
    ours = zarr.open_group(tmp_path / "h.zarr", mode="r")
    reference = zarr.open_group(tmp_path / "ref.zarr", mode="w", zarr_format=3)
    for name in _names(storage):
        array = ours[name]
        assert array.chunks == (CHUNK, array.shape[1]) and array.shards == (3 * CHUNK, array.shape[1])
        theirs = reference.create_array(
            name, shape=array.shape, dtype=array.dtype, chunks=array.chunks, shards=array.shards,
            compressors=array.compressors, fill_value=0,
        )  # fmt: skip
        theirs[:] = array[:]
        files = [p.relative_to(tmp_path / "h.zarr") for p in _chunk_files(tmp_path / "h.zarr" / name)]
        assert [f.parent.name for f in files] == ["0", "1", "2"]
        for f in files:
            assert (tmp_path / "h.zarr" / f).read_bytes() == (tmp_path / "ref.zarr" / f).read_bytes(), f
    aux, final, _ = rows
    assert np.array_equal(ours["aux"][:], aux) and np.array_equal(ours["final"][:], final)


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_the_direct_reader_reads_shards_as_zarr_does(tmp_path, storage):
    """Every row range, whole samples and the raw rows, equal between a sharded store, read straight
    from its shard files, and the same rows unsharded."""
    rows = _rows(storage)
    _write(tmp_path / "sharded.zarr", storage, 4, rows)
    _write(tmp_path / "plain.zarr", storage, 1, rows)
    sharded, plain = HiddenStore(tmp_path / "sharded.zarr"), HiddenStore(tmp_path / "plain.zarr")
    assert all(direct_readable(getattr(sharded, n)) for n in _names(storage))
    total = sum(LENGTHS)
    for name in _names(storage):
        for lo, hi in [(0, total), (0, 1), (23, 25), (47, 96), (95, 97), (150, total), (160, 160)]:
            assert np.array_equal(sharded.stored_rows(name, lo, hi), plain.stored_rows(name, lo, hi))
    for index in range(len(LENGTHS)):
        for a, b in zip(sharded.sample(index), plain.sample(index), strict=True):
            assert torch.equal(a, b)


def test_the_direct_reader_reads_a_store_zarr_sharded(tmp_path):
    """zarr's own sharded array (its write path, its index) read straight from the files."""
    data = np.random.default_rng(0).integers(0, 255, (160, 24), dtype=np.uint8)
    group = zarr.open_group(tmp_path / "z.zarr", mode="w", zarr_format=3)
    array = group.create_array("aux", shape=data.shape, dtype=np.uint8, chunks=(24, 24), shards=(96, 24),
                               compressors=zarr.codecs.BloscCodec(cname="zstd"), fill_value=0)  # fmt: skip
    array[:] = data
    from eyas.store.chunk_rows import ChunkRows

    assert direct_readable(array)
    reader = ChunkRows(array, tmp_path / "z.zarr" / "aux")
    assert np.array_equal(reader.rows(0, 160), data) and np.array_equal(reader.rows(90, 101), data[90:101])


def test_a_damaged_shard_index_is_refused_naming_its_file(tmp_path):
    rows = _rows("fp8_e4m3")
    _write(tmp_path / "h.zarr", "fp8_e4m3", 3, rows)
    shard = tmp_path / "h.zarr" / "aux" / "c" / "1" / "0"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # inside the index: its crc32c no longer matches
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"aux/c/1/0: the shard index fails its crc32c"):
        HiddenStore(tmp_path / "h.zarr").stored_rows("aux", 72, 80)


def test_extraction_and_validation_take_sharded_stores(tmp_path, token_shard_path, tiny_model_dir):
    """The HF backend with chunks_per_shard 2 writes the same states as unsharded, in half the chunk
    files; validation passes it and finds a shard file gone."""
    from eyas.extract.hf_backend import extract_shard
    from eyas.validate import StoreInvalid, validate_store

    plain, sharded = tmp_path / "plain.zarr", tmp_path / "sharded.zarr"
    extract_shard(str(token_shard_path), str(plain), str(tiny_model_dir), **EXTRACT_KW)
    extract_shard(str(token_shard_path), str(sharded), str(tiny_model_dir), chunks_per_shard=2, **EXTRACT_KW)
    a, b = HiddenStore(plain), HiddenStore(sharded)
    assert b.attrs["chunks_per_shard"] == 2 and b.aux.shards == (512, b.aux.shape[1])
    for name in ("aux", "final"):
        assert np.array_equal(a.stored_rows(name, 0, a.aux.shape[0]), b.stored_rows(name, 0, b.aux.shape[0]))
    chunk_files = len(_chunk_files(plain / "aux"))
    assert chunk_files >= 4 and len(_chunk_files(sharded / "aux")) == (chunk_files + 1) // 2
    manifest = validate_store(token_shard_path, sharded)
    assert manifest["ok"]
    (sharded / "final" / "c" / "1" / "0").unlink()
    with pytest.raises(StoreInvalid, match="'final': 2 of .* chunks missing"):
        validate_store(token_shard_path, sharded)
    index_at = sharded / "aux" / "c" / "0" / "0"
    data = bytearray(index_at.read_bytes())
    data[-10] ^= 0xFF
    index_at.write_bytes(bytes(data))
    with pytest.raises(StoreInvalid, match=r"'aux': .*aux/c/0/0: the shard index fails its crc32c"):
        validate_store(token_shard_path, sharded)
