"""Zarr round trips of token shards and hidden stores; atomicity; provenance checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr

from eyas.store import (
    HiddenStore,
    ProvenanceError,
    bf16_to_uint16,
    check_provenance,
    hidden_store_writer,
    read_token_shard,
    uint16_to_bf16,
    write_token_shard,
)


def _samples(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, 49152, n).astype(np.int32), rng.integers(0, 2, n).astype(np.uint8)) for n in lengths
    ]


def test_token_shard_round_trip(tmp_path):
    samples = _samples([5, 300, 1, 77])
    write_token_shard(tmp_path / "s.zarr", samples, ["a", "b", "c", "d"], {"split": "train", "shard": 0})
    shard = read_token_shard(tmp_path / "s.zarr")
    assert shard.num_samples == 4
    assert shard.sample_offsets.tolist() == [0, 5, 305, 306, 383]
    assert shard.attrs["sample_ids"] == ["a", "b", "c", "d"]
    assert shard.attrs["num_tokens"] == 383 and shard.attrs["split"] == "train"
    for i, (ids, mask) in enumerate(samples):
        got_ids, got_mask = shard.sample(i)
        assert got_ids.dtype == np.int32 and got_mask.dtype == np.uint8
        np.testing.assert_array_equal(got_ids, ids)
        np.testing.assert_array_equal(got_mask, mask)


def test_empty_token_shard(tmp_path):
    write_token_shard(tmp_path / "e.zarr", [], [], {})
    shard = read_token_shard(tmp_path / "e.zarr")
    assert shard.num_samples == 0 and shard.sample_offsets.tolist() == [0]


def test_bf16_view_round_trip_is_exact():
    x = torch.randn(1000, dtype=torch.float32) * 100
    bits = bf16_to_uint16(x)
    assert bits.dtype == np.uint16
    assert torch.equal(uint16_to_bf16(bits), x.to(torch.bfloat16))


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 1, 0, 2]])
def test_hidden_store_round_trip_any_write_order(tmp_path, order):
    lengths, hidden, taps = [40, 3, 100, 17], 8, 3
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    aux = torch.randn(offsets[-1], taps * hidden)
    final = torch.randn(offsets[-1], hidden)
    with hidden_store_writer(
        tmp_path / "h.zarr", offsets, hidden, taps, {"model_id": "m"}, chunk_tokens=16
    ) as w:
        for i in order:
            lo, hi = offsets[i], offsets[i + 1]
            w.write_sample(i, bf16_to_uint16(aux[lo:hi]), bf16_to_uint16(final[lo:hi]))
        assert w.pending_chunks == 0
    store = HiddenStore(tmp_path / "h.zarr")
    assert store.attrs["num_tokens"] == 160 and store.attrs["dtype"] == "bfloat16"
    assert store.aux.chunks == (16, taps * hidden)
    for i in range(len(lengths)):
        got_aux, got_final = store.sample(i)
        lo, hi = offsets[i], offsets[i + 1]
        assert torch.equal(got_aux, aux[lo:hi].bfloat16())
        assert torch.equal(got_final, final[lo:hi].bfloat16())


def test_incomplete_hidden_store_never_appears(tmp_path):
    offsets = np.array([0, 10, 20])
    with pytest.raises(RuntimeError, match="1 samples never written"):
        with hidden_store_writer(tmp_path / "h.zarr", offsets, 4, 3, {}) as w:
            w.write_sample(0, np.zeros((10, 12), np.uint16), np.zeros((10, 4), np.uint16))
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_wrong_shapes_and_double_writes(tmp_path):
    offsets = np.array([0, 10])
    with pytest.raises(ValueError, match="expected"):
        with hidden_store_writer(tmp_path / "h.zarr", offsets, 4, 3, {}) as w:
            w.write_sample(0, np.zeros((9, 12), np.uint16), np.zeros((9, 4), np.uint16))
    with pytest.raises(ValueError, match="written twice"):
        with hidden_store_writer(tmp_path / "h.zarr", offsets, 4, 3, {}) as w:
            w.write_sample(0, np.zeros((10, 12), np.uint16), np.zeros((10, 4), np.uint16))
            w.write_sample(0, np.zeros((10, 12), np.uint16), np.zeros((10, 4), np.uint16))
    assert not (tmp_path / "h.zarr").exists()


def test_write_rows_assembles_chunked_prefill_pieces(tmp_path):
    # Pieces of one sample arrive over several forwards (SGLang chunked prefill), interleaved with
    # other samples; the store equals one written whole, and out-of-order pieces are refused.
    rng = np.random.default_rng(1)
    offsets = np.array([0, 300, 301, 700])
    aux = rng.integers(0, 0x7F00, (700, 12), dtype=np.uint16)  # finite bf16 bit patterns (no NaN)
    final = rng.integers(0, 0x7F00, (700, 4), dtype=np.uint16)
    with hidden_store_writer(tmp_path / "whole.zarr", offsets, 4, 3, {}, chunk_tokens=128) as w:
        for i in range(3):
            w.write_sample(i, aux[offsets[i] : offsets[i + 1]], final[offsets[i] : offsets[i + 1]])
    pieces = [(2, 0, 150), (0, 0, 100), (2, 150, 398), (1, 0, 1), (0, 100, 300), (2, 398, 399)]
    with hidden_store_writer(tmp_path / "pieces.zarr", offsets, 4, 3, {}, chunk_tokens=128) as w:
        for index, lo, hi in pieces:
            base = offsets[index]
            done = w.write_rows(index, lo, aux[base + lo : base + hi], final[base + lo : base + hi])
            assert done == (hi == offsets[index + 1] - base)
        with pytest.raises(ValueError, match="is complete"):
            w.write_rows(0, 300, aux[:0], final[:0])  # sample 0 is complete: nothing may follow
    whole, pieced = HiddenStore(tmp_path / "whole.zarr"), HiddenStore(tmp_path / "pieces.zarr")
    for i in range(3):
        assert all(torch.equal(a, b) for a, b in zip(whole.sample(i), pieced.sample(i), strict=True))
    with pytest.raises(ValueError, match="contiguous"):
        with hidden_store_writer(tmp_path / "gap.zarr", offsets, 4, 3, {}) as w:
            w.write_rows(0, 10, aux[10:20], final[10:20])  # rows 0..9 never came
    assert not (tmp_path / "gap.zarr").exists()


def test_compression_is_lossless_on_real_shaped_values(tmp_path):
    # Hidden-state-like values: per-channel scales spanning orders of magnitude (outlier channels).
    rng = np.random.default_rng(0)
    scales = np.exp(rng.normal(0, 1.5, 64)).astype(np.float32)
    values = torch.from_numpy(rng.standard_normal((512, 64)).astype(np.float32) * scales)
    offsets = np.array([0, 512])
    with hidden_store_writer(tmp_path / "h.zarr", offsets, 64, 1, {}) as w:
        w.write_sample(0, bf16_to_uint16(values), bf16_to_uint16(values))
    got_aux, _ = HiddenStore(tmp_path / "h.zarr").sample(0)
    assert torch.equal(got_aux, values.bfloat16())


def test_check_provenance_names_the_field():
    attrs = {"model_id": "a", "layer_ids": [1, 14, 26]}
    check_provenance(attrs, {"model_id": "a", "layer_ids": (1, 14, 26)}, "store")
    with pytest.raises(ProvenanceError, match="'layer_ids'"):
        check_provenance(attrs, {"model_id": "a", "layer_ids": [2, 15, 27]}, "store")


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_direct_chunk_writes_equal_zarrs_own(tmp_path, storage):
    """The writer encodes chunks itself; every chunk file must be byte-identical to zarr's, edge
    chunk included, so any zarr reader reads the store."""
    from eyas.store.quant import fp8_quantize

    lengths, hidden, taps = [40, 3, 100, 17], 8, 3  # 160 tokens in 24-token chunks: an edge chunk
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    states = torch.randn(int(offsets[-1]), taps + 1, hidden) * torch.logspace(-2, 2, hidden)
    if storage == "bf16":
        aux = bf16_to_uint16(states[:, :taps].reshape(len(states), -1))
        final = bf16_to_uint16(states[:, taps])
        scale = None
    else:
        bits, scales = fp8_quantize(states)
        aux, final = bits[:, :taps].reshape(len(states), -1).numpy(), bits[:, taps].numpy()
        scale = scales.numpy()
    with hidden_store_writer(tmp_path / "h.zarr", offsets, hidden, taps, {}, 24, storage) as w:
        for i in range(len(lengths)):
            lo, hi = offsets[i], offsets[i + 1]
            rows = (aux[lo:hi], final[lo:hi]) + (() if scale is None else (scale[lo:hi],))
            w.write_sample(i, *rows)
    ours = zarr.open_group(tmp_path / "h.zarr", mode="r")
    reference = zarr.open_group(tmp_path / "ref.zarr", mode="w", zarr_format=3)
    for name in ("aux", "final", "scale") if scale is not None else ("aux", "final"):
        theirs = reference.create_array(
            name, shape=ours[name].shape, dtype=ours[name].dtype, chunks=ours[name].chunks,
            compressors=ours[name].compressors, fill_value=0,
        )  # fmt: skip
        theirs[:] = ours[name][:]
        files = sorted(
            p.relative_to(tmp_path / "h.zarr") for p in (tmp_path / "h.zarr" / name / "c").rglob("*")
        )
        assert len([f for f in files if (tmp_path / "h.zarr" / f).is_file()]) == 7  # ceil(160 / 24)
        for f in files:
            if (tmp_path / "h.zarr" / f).is_file():
                assert (tmp_path / "h.zarr" / f).read_bytes() == (tmp_path / "ref.zarr" / f).read_bytes()


def test_split_is_readable_while_shards_are_missing(tmp_path):
    """Only complete stores count: a killed job's temp dir is ignored, the missing shards are named."""
    from eyas.store import list_hidden_stores

    offsets = np.array([0, 3])
    for shard in (0, 2):
        with hidden_store_writer(tmp_path / f"shard-{shard:05d}.zarr", offsets, 4, 1, {}) as w:
            w.write_sample(0, np.zeros((3, 4), np.uint16), np.zeros((3, 4), np.uint16))
    (tmp_path / ".shard-00001.zarr.tmp-123").mkdir()  # what a killed extraction leaves
    present, missing = list_hidden_stores(tmp_path, 4)
    assert [p.name for p in present] == ["shard-00000.zarr", "shard-00002.zarr"]
    assert missing == [1, 3]
    assert all(HiddenStore(p).num_samples == 1 for p in present)
    from eyas.store import shard_name, shard_paths

    assert shard_name(2) == shard_name("00002") == "shard-00002.zarr"  # index or Snakemake wildcard
    (tmp_path / shard_name(11)).mkdir()
    assert [p.rsplit("/", 1)[1] for p in shard_paths(tmp_path)] == [shard_name(i) for i in (0, 2, 11)]
