"""Direct chunk reads (`eyas.store.chunk_rows`) return exactly what zarr returns, and are used only where
the array's layout is eyas's own."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import zarr

from eyas.store import HiddenStore, bf16_to_uint16, hidden_codec, hidden_store_writer
from eyas.store.chunk_rows import ChunkRows, direct_readable


def _store(path, storage, lengths=(40, 0, 3, 100, 17), hidden=8, taps=3, chunk=24):
    from eyas.store.quant import fp8_quantize

    offsets = np.concatenate([[0], np.cumsum(lengths)])
    states = torch.randn(int(offsets[-1]), taps + 1, hidden) * torch.logspace(-2, 2, hidden)
    with hidden_store_writer(path, offsets, hidden, taps, {}, chunk, storage) as writer:
        for i in range(len(lengths)):
            lo, hi = offsets[i], offsets[i + 1]
            if storage == "bf16":
                aux = bf16_to_uint16(states[lo:hi, :taps].reshape(hi - lo, taps * hidden))
                writer.write_sample(i, aux, bf16_to_uint16(states[lo:hi, taps]))
            else:
                bits, scale = fp8_quantize(states[lo:hi])
                aux = bits[:, :taps].reshape(hi - lo, taps * hidden).numpy()
                writer.write_sample(i, aux, bits[:, taps].numpy(), scale.numpy())
    return offsets


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_direct_rows_equal_zarr_slices(tmp_path, storage):
    offsets = _store(tmp_path / "h.zarr", storage)
    group = zarr.open_group(tmp_path / "h.zarr", mode="r")
    names = ("aux", "final") + (("scale",) if storage == "fp8_e4m3" else ())
    rng = np.random.default_rng(0)
    for name in names:
        array = group[name]
        assert direct_readable(array)
        reader = ChunkRows(array, tmp_path / "h.zarr" / name)
        ranges = [(0, 0), (0, 160), (150, 160), (23, 25), (24, 48)]  # empty, all, edge chunk, boundaries
        ranges += [tuple(sorted(rng.integers(0, 161, 2))) for _ in range(20)]
        for lo, hi in ranges:
            got = reader.rows(int(lo), int(hi))
            assert got.dtype == array.dtype and np.array_equal(got, array[lo:hi]), (name, lo, hi)
        with pytest.raises(IndexError, match=r"rows \[150, 161\)"):
            reader.rows(150, 161)
    store = HiddenStore(tmp_path / "h.zarr")
    for s in range(len(offsets) - 1):  # HiddenStore.sample goes through the direct reader
        lo, hi = offsets[s], offsets[s + 1]
        aux, final = store.sample(s)
        assert aux.shape == (hi - lo, 24) and final.shape == (hi - lo, 8)


def test_other_layouts_are_read_through_zarr(tmp_path):
    group = zarr.open_group(tmp_path / "g.zarr", mode="w", zarr_format=3)
    data = np.arange(60, dtype=np.uint16).reshape(20, 3)
    plain = group.create_array("plain", shape=data.shape, dtype=data.dtype, chunks=(8, 3), fill_value=0)
    dotted = group.create_array(
        "dotted", shape=data.shape, dtype=data.dtype, chunks=(8, 3), fill_value=0,
        compressors=[hidden_codec("bf16")], chunk_key_encoding={"name": "default", "separator": "."},
    )  # fmt: skip
    split = group.create_array(
        "split", shape=data.shape, dtype=data.dtype, chunks=(8, 2), compressors=[hidden_codec("bf16")]
    )
    ours = group.create_array(
        "ours", shape=data.shape, dtype=data.dtype, chunks=(8, 3), compressors=[hidden_codec("bf16")]
    )
    for array in (plain, dotted, split, ours):
        array[:] = data
    assert not direct_readable(plain)  # zstd, not Blosc (zarr's default)
    assert not direct_readable(dotted) and not direct_readable(split)
    assert direct_readable(ours)


def test_a_missing_chunk_reads_as_the_fill_value_and_a_corrupt_one_fails(tmp_path):
    _store(tmp_path / "h.zarr", "bf16")
    array = zarr.open_group(tmp_path / "h.zarr", mode="r")["final"]
    reader = ChunkRows(array, tmp_path / "h.zarr" / "final")
    (tmp_path / "h.zarr" / "final" / "c" / "1" / "0").unlink()
    assert np.array_equal(reader.rows(20, 50), array[20:50]) and not reader.rows(24, 48).any()
    (tmp_path / "h.zarr" / "final" / "c" / "2" / "0").write_bytes(b"not blosc")
    with pytest.raises(Exception):  # noqa: B017 - numcodecs raises its own error for a bad frame
        reader.rows(48, 50)


def test_readers_in_threads_agree(tmp_path):
    offsets = _store(tmp_path / "h.zarr", "bf16", lengths=[300] * 8, chunk=64)
    store = HiddenStore(tmp_path / "h.zarr")
    want = [torch.cat(store.sample(s), dim=1) for s in range(8)]
    got: dict[int, torch.Tensor] = {}

    def read(s):
        got[s] = torch.cat(HiddenStore(tmp_path / "h.zarr").sample(s), dim=1)

    threads = [threading.Thread(target=read, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(got[s], want[s]) for s in range(8)) and len(offsets) == 9


def test_rows_into_a_destination_equal_zarr_and_whole_chunks_decode_in_place(tmp_path):
    _store(tmp_path / "h.zarr", "bf16")
    array = zarr.open_group(tmp_path / "h.zarr", mode="r")["aux"]
    reader = ChunkRows(array, tmp_path / "h.zarr" / "aux")
    for lo, hi in [(0, 0), (0, 160), (24, 48), (23, 73), (150, 160), (5, 6)]:
        out = np.full((hi - lo, 24), 0xFFFF, dtype=np.uint16)  # stale bits must all be overwritten
        assert reader.rows(lo, hi, out=out) is out and np.array_equal(out, array[lo:hi]), (lo, hi)
    with pytest.raises(ValueError, match="expected C-contiguous"):
        reader.rows(0, 24, out=np.zeros((24, 48), np.uint16)[:, ::2])
    (tmp_path / "h.zarr" / "aux" / "c" / "1" / "0").write_bytes(b"not blosc")  # rows 24-47: whole chunk
    with pytest.raises(ValueError, match="decodes to -1 bytes"):
        reader.rows(24, 48, out=np.zeros((24, 24), np.uint16))


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_sample_into_equals_sample(tmp_path, storage):
    offsets = _store(tmp_path / "h.zarr", storage)
    store = HiddenStore(tmp_path / "h.zarr")
    batch = torch.full((2, 100, 32), float("nan"), dtype=store.sample_dtype)  # rows of a padded batch
    for s in range(len(offsets) - 1):
        aux, final = store.sample(s)
        n = aux.shape[0]
        store.sample_into(s, batch[1, :n, :24], batch[0, :n, 24:])  # a strided view: the copy path
        assert torch.equal(batch[1, :n, :24], aux) and torch.equal(batch[0, :n, 24:], final)
        into_aux, into_final = torch.empty_like(aux), torch.empty_like(final)
        store.sample_into(s, into_aux, into_final)
        assert torch.equal(into_aux, aux) and torch.equal(into_final, final)
