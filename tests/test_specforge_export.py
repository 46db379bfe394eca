"""`eyas export-specforge`: eyas stores -> SpecForge offline samples, read back by `import-specforge`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import zarr

import eyas.interop.specforge_export as sfe
from eyas.interop.cli import main
from eyas.interop.specforge_import import import_specforge
from eyas.store import HiddenStore, ProvenanceError, hidden_store_writer, read_token_shard
from eyas.store.quant import fp8_quantize

HIDDEN, TAPS = 64, 3
LENGTHS = [5, 7, 1, 300, 17, 9, 40]  # imported 4 a shard: shards of 4 and 3; 300 spans two 256-token chunks


@pytest.fixture
def stores(tmp_path, tiny_model_dir):
    """A results root with two bf16 shards (tokens/train, hidden/train), made by `import_specforge`
    from random SpecForge-style samples (the importer is tested on its own in test_specforge_import)."""
    rng = torch.Generator().manual_seed(1)
    dump = tmp_path / "seed-dump"
    (dump / "rows").mkdir(parents=True)
    for index, length in enumerate(LENGTHS):
        sample = {
            "input_ids": torch.randint(0, 49152, (length,), generator=rng),
            "loss_mask": (torch.rand(length, generator=rng) > 0.4).long(),
            "hidden_state": torch.randn(1, length, HIDDEN, generator=rng).to(torch.bfloat16),
            "aux_hidden_state": torch.randn(1, length, TAPS * HIDDEN, generator=rng).to(torch.bfloat16),
        }
        torch.save(sample, dump / "rows" / f"data_{index}.ckpt")
    root = tmp_path / "results"
    stats = import_specforge(
        dump, root, tiny_model_dir, samples_per_shard=4, layer_ids=[0, 1, 2], model_id="tiny"
    )
    assert stats["kept"] == 7 and stats["shards"] == 2
    return root


def _samples(root, split="train"):
    """Every (ids, mask, aux bits, final bits) of a results root, in shard and sample order."""
    out = []
    for tok_path, hid_path in sfe.store_pairs(root, split):
        shard, store = read_token_shard(tok_path), HiddenStore(hid_path)
        for s in range(shard.num_samples):
            ids, mask = shard.sample(s)
            aux, final = store.sample(s)
            out.append((ids.copy(), mask.copy(), aux, final))
    return out


def test_round_trip_through_import_specforge(tmp_path, stores, tiny_model_dir, capsys):
    out = tmp_path / "sf"
    code = main(["export-specforge", str(stores), str(out), "--file-group-size", "3"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["count"] == 7 and summary["tokens"] == sum(LENGTHS)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ckpt"))
    assert files == sorted(f"rows_{i // 3 * 3}-{i // 3 * 3 + 3}/data_{i}.ckpt" for i in range(7))
    manifest = json.loads((out / sfe.MANIFEST).read_text())
    assert manifest["count"] == 7 and [s["samples"] for s in manifest["sources"]] == [4, 3]
    assert manifest["provenance"]["model_id"] == "tiny" and manifest["provenance"]["layer_ids"] == [0, 1, 2]

    sample = torch.load(out / "rows_3-6/data_3.ckpt", weights_only=True)  # SpecForge's dtypes and shapes
    assert set(sample) == {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}
    assert sample["input_ids"].dtype == sample["loss_mask"].dtype == torch.int64
    assert sample["input_ids"].shape == sample["loss_mask"].shape == (300,)
    assert sample["hidden_state"].shape == (1, 300, HIDDEN) and sample["hidden_state"].dtype == torch.bfloat16
    assert sample["aux_hidden_state"].shape == (1, 300, TAPS * HIDDEN)
    assert sample["aux_hidden_state"].dtype == torch.bfloat16
    # each file holds only its own sample's bytes (no shared storage of a larger buffer saved)
    assert (out / "rows_3-6/data_3.ckpt").stat().st_size < 300 * 4 * HIDDEN * 2 + 300 * 16 + 4096

    back = tmp_path / "back"
    stats = import_specforge(
        out, back, tiny_model_dir, samples_per_shard=4, layer_ids=[0, 1, 2], model_id="tiny"
    )
    assert stats["kept"] == 7 and stats["rejected"] == 0 and stats["padding_rows_dropped"] == 0
    original, again = _samples(stores), _samples(back)
    assert len(original) == len(again) == 7
    for (ids, mask, aux, final), (ids2, mask2, aux2, final2) in zip(original, again, strict=True):
        assert np.array_equal(ids, ids2) and np.array_equal(mask, mask2)
        assert torch.equal(aux.view(torch.uint16), aux2.view(torch.uint16))  # bit for bit
        assert torch.equal(final.view(torch.uint16), final2.view(torch.uint16))


def _to_fp8(src: str, dst) -> None:
    """Re-encode a bf16 hidden store as fp8_e4m3 (per-token, per-tap scales), same provenance."""
    store = HiddenStore(src)
    attrs = {k: v for k, v in store.attrs.items() if k not in ("scale_rule",)}
    with hidden_store_writer(dst, store.sample_offsets, HIDDEN, TAPS, attrs, storage="fp8_e4m3") as writer:
        for s in range(store.num_samples):
            aux, final = store.sample(s)
            rows = len(aux)
            qa, sa = fp8_quantize(aux.view(rows, TAPS, HIDDEN))
            qf, sf = fp8_quantize(final.view(rows, 1, HIDDEN))
            scale = torch.cat([sa, sf], dim=1).numpy()
            writer.write_sample(s, qa.reshape(rows, -1).numpy(), qf.reshape(rows, -1).numpy(), scale)


def test_fp8_store_exports_its_decoded_values(tmp_path, stores):
    second = stores / "hidden/train/shard-00001.zarr"
    before = [HiddenStore(second).sample(s) for s in range(3)]  # the bf16 values it was made from
    _to_fp8(str(second), tmp_path / "fp8.zarr")
    shutil.rmtree(second)
    shutil.move(tmp_path / "fp8.zarr", second)
    fp8 = HiddenStore(second)
    assert fp8.storage == "fp8_e4m3"
    out = tmp_path / "sf"
    manifest = sfe.export_specforge(stores, out)
    assert [s["storage"] for s in manifest["sources"]] == ["bf16", "fp8_e4m3"]
    for s in range(fp8.num_samples):
        sample = torch.load(out / f"rows_0-2000/data_{4 + s}.ckpt", weights_only=True)
        got_aux, got_final = sample["aux_hidden_state"][0], sample["hidden_state"][0]
        aux, final = fp8.sample(s)  # float32, dequantized by the store reader
        assert torch.equal(got_aux.view(torch.uint16), aux.to(torch.bfloat16).view(torch.uint16))
        assert torch.equal(got_final.view(torch.uint16), final.to(torch.bfloat16).view(torch.uint16))
        # decoded values, not raw fp8 bytes: within e4m3's relative step (1/16, plus bf16 rounding)
        want_aux, want_final = before[s]
        assert not torch.equal(got_aux, want_aux)
        for got, want in ((got_aux, want_aux), (got_final, want_final)):
            rows = want.float().view(len(want), -1, HIDDEN)
            err = (got.float().view_as(rows) - rows).abs()
            assert (err <= rows.abs().amax(-1, keepdim=True) / 14).all()


def test_mismatched_provenance_is_refused_naming_file_and_field(tmp_path, stores):
    bad = stores / "hidden/train/shard-00001.zarr"
    zarr.open_group(bad, mode="r+").attrs["model_hash"] = "sha256:other"
    out = tmp_path / "sf"
    with pytest.raises(ProvenanceError, match=r"shard-00001\.zarr: provenance field 'model_hash'"):
        sfe.export_specforge(stores, out)
    assert not out.exists()


def test_corrupt_token_shard_is_refused_naming_file_and_field(tmp_path, stores):
    group = zarr.open_group(stores / "tokens/train/shard-00000.zarr", mode="r+")
    group["input_ids"][0] = (int(group["input_ids"][0]) + 1) % 49152
    out = tmp_path / "sf"
    field = r"hidden/train/shard-00000\.zarr: provenance field 'tokens_checksum'"
    with pytest.raises(ProvenanceError, match=field):
        main(["export-specforge", str(stores), str(out)])
    assert not out.exists()


def test_a_failure_mid_export_leaves_no_output(tmp_path, stores, monkeypatch):
    real_save, calls = torch.save, []

    def failing_save(obj, path):
        calls.append(path)
        if len(calls) == 5:
            raise OSError("disk full (injected)")
        real_save(obj, path)

    monkeypatch.setattr(sfe.torch, "save", failing_save)
    out = tmp_path / "sf"
    with pytest.raises(OSError, match="injected"):
        sfe.export_specforge(stores, out)
    assert len(calls) == 5
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "seed-dump"]  # no temp sibling left


def test_eyas_targets_mask_puts_specforge_loss_on_eyas_positions(tmp_path, stores):
    out = tmp_path / "sf"
    sfe.export_specforge(stores, out, loss_mask="eyas-targets")
    for index, (ids, mask, _, _) in enumerate(_samples(stores)):
        sample = torch.load(out / f"rows_0-2000/data_{index}.ckpt", weights_only=True)
        written = sample["loss_mask"].numpy()
        assert np.array_equal(sample["input_ids"].numpy(), ids)
        # SpecForge gates step k at t on written[t+k]; eyas on mask[t+2+k]: equal for every t, k
        for t in range(len(ids)):
            assert written[t] == (mask[t + 2] if t + 2 < len(ids) else 0)


def test_specforge_own_reader_accepts_the_export(tmp_path, stores):
    """Where specforge 0.2.0 is importable (the GPU image, installed --no-deps): its own offline reader
    and EAGLE3 normalizer take every exported file, and its target-head shift lines ids up as documented."""
    reader = pytest.importorskip("specforge.runtime.data_plane.offline_reader")
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.utils import padding

    out = tmp_path / "sf"
    sfe.export_specforge(stores, out)
    files = reader.list_feature_files(str(out))
    assert len(files) == 7
    for path in files:
        reader._inspect_feature_file(path, reader._OFFLINE_EAGLE3_KEYS)
        raw = load_feature_file(path)
        sample = normalize_offline_sample(raw, max_len=2048)
        length = raw["input_ids"].numel()
        assert sample["hidden_state"].shape == (1, length, TAPS * HIDDEN)
        assert sample["target"].shape == (1, length, HIDDEN)
        assert torch.equal(padding(sample["input_ids"], left=False)[0, :-1], raw["input_ids"][1:])
