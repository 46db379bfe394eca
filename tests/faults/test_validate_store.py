"""Store validation (eyas.validate) on a real extracted store, and on copies broken on purpose."""

from __future__ import annotations

import hashlib
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from faultkit import EXTRACT_KW, LAYER_IDS

from eyas.core.layer_ids import LAYER_ID_CONVENTION
from eyas.core.provenance import model_hash
from eyas.store import HiddenStore, write_token_shard
from eyas.validate import (
    MANIFEST_FORMAT,
    StoreInvalid,
    check_manifest,
    check_manifests,
    chunk_summary,
    nonfinite_bf16,
    nonfinite_fp8,
    validate_store,
    verify_manifest,
    write_manifest,
)


def test_nonfinite_bf16_matches_torch_on_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    assert nonfinite_bf16(bits) == (int(torch.isnan(values).sum()), int(torch.isinf(values).sum()))
    assert nonfinite_bf16(bits) == (254, 2)  # 2 signs x 127 NaN mantissas; +-Inf


@pytest.fixture
def store_copy(reference_store, tmp_path) -> Path:
    path = tmp_path / reference_store.name
    shutil.copytree(reference_store, path)
    return path


def test_valid_store_gives_a_manifest_that_consumers_accept(
    reference_store, token_shard_path, tiny_model_dir, tmp_path
):
    expected = {"model_hash": model_hash(tiny_model_dir), "layer_ids": LAYER_IDS, "model_id": "tiny"}
    manifest = validate_store(token_shard_path, reference_store, expected)
    store = HiddenStore(reference_store)
    assert manifest["ok"] and manifest["provenance"]["layer_id_convention"] == LAYER_ID_CONVENTION
    assert list(manifest["nonfinite"]) == [f"aux[{i}] layer {v}" for i, v in enumerate(LAYER_IDS)] + ["final"]
    assert all(c == {"nan": 0, "inf": 0} for c in manifest["nonfinite"].values())
    for name in ("aux", "final"):
        array = getattr(store, name)
        assert array.nchunks >= 4  # the fixture spans several chunks
        assert manifest["arrays"][name]["files"] == array.nchunks + 1  # chunk files + zarr.json
    path = tmp_path / "shard-00000.manifest.json"
    write_manifest(path, manifest)
    assert json.loads(path.read_text()) == manifest
    verify_manifest(reference_store, path)
    check_manifests([str(reference_store)], [str(path)])


def _broken(kind: str, store: Path, token_shard: Path, tmp_path: Path) -> tuple[Path, dict | None]:
    """Break `store` (or pick a wrong shard / expectation); return the token shard to check against."""
    group = zarr.open_group(store, mode="r+")
    hidden = group.attrs["hidden_size"]
    if kind == "nan_in_tap1":
        rows = group["aux"][10:13]
        rows[:, hidden + 5] = 0x7FC0  # a quiet NaN in tap 1
        group["aux"][10:13] = rows
    elif kind == "inf_in_final":
        rows = group["final"][300:301]
        rows[0, :4] = 0xFF80  # -Inf
        group["final"][300:301] = rows
    elif kind == "chunk_file_deleted":
        (store / "aux" / "c" / "1" / "0").unlink()
    elif kind == "wrong_token_shard":
        other = tmp_path / "other-tokens.zarr"
        attrs = {k: v for k, v in zarr.open_group(token_shard, mode="r").attrs.items()}
        write_token_shard(other, [(np.arange(5, dtype=np.int32), np.ones(5, np.uint8))], ["x"], attrs)
        return other, None
    elif kind == "provenance_missing":
        attrs = dict(group.attrs)
        del attrs["model_hash"]
        group.attrs.clear()
        group.attrs.update(attrs)
    elif kind == "other_model":
        return token_shard, {"model_hash": "0" * 64}
    elif kind == "not_a_store":
        shutil.rmtree(store)
        store.mkdir()
    return token_shard, None


BROKEN = {  # kind -> text the StoreInvalid must hold
    "nan_in_tap1": f"aux[1] layer {LAYER_IDS[1]}: 3 NaN, 0 Inf",
    "inf_in_final": "final: 0 NaN, 4 Inf",
    "chunk_file_deleted": "array 'aux': 1 of ",  # then: N chunks missing on disk
    "wrong_token_shard": "field 'num_samples'",
    "provenance_missing": "provenance fields missing: ['model_hash']",
    "other_model": "field 'model_hash'",
    "not_a_store": "cannot be opened as a hidden store",
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_store_is_refused_naming_the_problem(kind, store_copy, token_shard_path, tmp_path, ledger):
    with ledger.case("bad_input", f"hidden store: {kind}", "StoreInvalid naming the field/tap"):
        shard, expected = _broken(kind, store_copy, token_shard_path, tmp_path)
        with pytest.raises(StoreInvalid) as err:
            validate_store(shard, store_copy, expected)
        assert BROKEN[kind] in str(err.value) and str(store_copy) in str(err.value), str(err.value)


def test_manifest_goes_stale_when_the_store_changes(store_copy, token_shard_path, tmp_path, ledger):
    path = tmp_path / "m.json"
    write_manifest(path, validate_store(token_shard_path, store_copy))
    with ledger.case("bad_input", "manifest: chunk bytes flipped after validation", "verify refuses"):
        chunk = store_copy / "final" / "c" / "0" / "0"
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0xFF
        chunk.write_bytes(bytes(data))
        check_manifest(store_copy, path)  # same size: the cheap check cannot see it ...
        for threads in (1, 4):
            with pytest.raises(StoreInvalid, match="array 'final' field 'sha256'"):
                verify_manifest(store_copy, path, threads=threads)  # ... the full one does
    with ledger.case("bad_input", "manifest: chunk deleted after validation", "check refuses"):
        (store_copy / "aux" / "c" / "0" / "0").unlink()
        with pytest.raises(StoreInvalid, match="array 'aux' field 'files'"):
            check_manifest(store_copy, path)


def _tree_digest_by_hand(store: Path, name: str) -> str:
    """The manifest's array sha256 as docs/design.md defines it, spelled out independently."""
    files = sorted(p for p in (store / name).rglob("*") if p.is_file())
    lines = "".join(
        f"{p.relative_to(store).as_posix()}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in files
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def test_array_digest_is_a_hash_of_file_hashes_whatever_the_threads(reference_store, token_shard_path):
    assert MANIFEST_FORMAT == "eyas.manifest/2"
    manifest = _without_seconds(validate_store(token_shard_path, reference_store, threads=1))
    assert _without_seconds(validate_store(token_shard_path, reference_store, threads=4)) == manifest
    with ThreadPoolExecutor(4) as pool:
        for name in ("aux", "final"):
            alone = chunk_summary(reference_store, name)
            assert chunk_summary(reference_store, name, pool=pool) == alone
            assert alone == {key: manifest["arrays"][name][key] for key in ("files", "bytes", "sha256")}
            assert alone["files"] > 4  # several chunk files, so the pool has work to spread
            assert alone["sha256"] == _tree_digest_by_hand(reference_store, name)
    assert manifest["arrays"]["aux"]["sha256"] != manifest["arrays"]["final"]["sha256"]


def test_one_changed_byte_changes_the_array_digest(store_copy, token_shard_path, tmp_path):
    path = tmp_path / "m.json"
    write_manifest(path, validate_store(token_shard_path, store_copy, threads=2))
    before = {name: chunk_summary(store_copy, name)["sha256"] for name in ("aux", "final")}
    chunks = sorted(p for p in (store_copy / "aux" / "c").rglob("*") if p.is_file())
    chunk = chunks[-1]  # the last chunk file: the change is not in the first bytes hashed
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0x01
    chunk.write_bytes(bytes(data))
    after = {name: chunk_summary(store_copy, name)["sha256"] for name in ("aux", "final")}
    assert after["aux"] != before["aux"] and after["final"] == before["final"]
    with pytest.raises(StoreInvalid, match="array 'aux' field 'sha256' differs"):
        verify_manifest(store_copy, path, threads=4)


def test_a_manifest_of_the_older_format_is_refused_naming_the_format(
    reference_store, token_shard_path, tmp_path
):
    manifest = validate_store(token_shard_path, reference_store)
    path = tmp_path / "m.json"
    write_manifest(path, manifest)
    verify_manifest(reference_store, path, threads=2)  # the current format passes ...
    write_manifest(path, {**manifest, "format": "eyas.manifest/1"})
    for check in (check_manifest, verify_manifest, lambda s, m: check_manifests([str(s)], [str(m)])):
        with pytest.raises(StoreInvalid) as err:  # ... the older one, whose sha256 meant another thing, not
            check(reference_store, path)
        assert "field 'format' is 'eyas.manifest/1', expected 'eyas.manifest/2'" in str(err.value)


def test_training_refuses_a_store_without_a_valid_manifest(reference_store, tmp_path, ledger):
    from eyas.config import TrainSettings
    from eyas.train.trainer import train

    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps({"format": MANIFEST_FORMAT, "ok": False}))
    older = tmp_path / "older.json"
    older.write_text(json.dumps({"format": "eyas.manifest/1", "ok": True}))
    for name, manifest, message in (
        ("missing", tmp_path / "none.json", "no manifest at"),
        ("failed", failed, "field 'ok' is False"),
        ("older-format", older, f"field 'format' is 'eyas.manifest/1', expected '{MANIFEST_FORMAT}'"),
    ):
        with ledger.case("bad_input", f"train with {name} manifest", "StoreInvalid before training"):
            with pytest.raises(StoreInvalid, match=message):
                train(
                    TrainSettings(device="cpu", progress=False),
                    token_shards=["unused"],
                    hidden_stores=[str(reference_store)],
                    vocab_path="unused",
                    model_dir="unused",
                    out_dir=str(tmp_path / "drafter"),
                    log_path=str(tmp_path / "log.csv"),
                    expected_provenance={},
                    manifests=[str(manifest)],
                )
            assert not (tmp_path / "drafter").exists()


def test_validate_script_resolves_default_taps_of_a_wrapped_config(
    reference_store, token_shard_path, tiny_model_dir, tmp_path, ledger
):
    """A Kimi-K2.5-style target (its language model's config nested under `text_config`) with
    `model.aux_layer_ids: null`: the validate stage resolves the default taps from the nested layer
    count, as extraction does, instead of failing on the wrapper's missing `num_hidden_layers`."""
    import runpy
    from types import SimpleNamespace

    from eyas.core.layer_ids import resolve_aux_layer_ids

    text = json.loads((tiny_model_dir / "config.json").read_text()) | {"num_hidden_layers": 61}
    kimi = tmp_path / "kimi"
    kimi.mkdir()
    (kimi / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": text}))
    taps = resolve_aux_layer_ids(json.loads((kimi / "config.json").read_text()), None)
    assert taps == [1, 29, 57]  # EAGLE-3's default [1, L//2-1, L-4] for L = 61
    store = tmp_path / "hidden" / "shard-00000.zarr"
    shutil.copytree(reference_store, store)  # as extraction with those taps would have written it
    zarr.open_group(store, mode="r+").attrs.update({"layer_ids": taps, "model_hash": model_hash(kimi)})
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    shutil.copytree(token_shard_path, tokens / "shard-00000.zarr")
    manifest = tmp_path / "shard-00000.manifest.json"
    sm = SimpleNamespace(
        input=SimpleNamespace(tokens=str(tokens), store=str(store), model=str(kimi)),
        output=SimpleNamespace(manifest=str(manifest)),
        params=SimpleNamespace(layer_ids=None, model_id="tiny"),
        wildcards=SimpleNamespace(split="train", shard="00000"),
        log=[str(tmp_path / "validate.log")],
        threads=2,
    )
    script = Path(__file__).parents[2] / "scripts" / "validate.py"
    with ledger.case("bad_input", "wrapped (text_config) target, default taps", "validates like extraction"):
        runpy.run_path(str(script), init_globals={"snakemake": sm})
        written = json.loads(manifest.read_text())
        assert written["ok"] and written["provenance"]["layer_ids"] == taps


def test_nonfinite_fp8_matches_torch_on_every_bit_pattern():
    bits = np.arange(256, dtype=np.uint8)
    values = torch.from_numpy(bits.copy()).view(torch.float8_e4m3fn).float()
    assert nonfinite_fp8(bits) == int(torch.isnan(values).sum()) == 2  # S.1111.111, both signs
    assert not torch.isinf(values).any()  # e4m3fn has no Inf


@pytest.fixture(scope="module")
def fp8_store(tmp_path_factory, token_shard_path, tiny_model_dir) -> Path:
    from eyas.extract.hf_backend import extract_shard

    threads = torch.get_num_threads()
    out = tmp_path_factory.mktemp("fp8_reference") / "shard-00000.zarr"
    try:
        extract_shard(str(token_shard_path), str(out), str(tiny_model_dir), storage="fp8_e4m3", **EXTRACT_KW)
    finally:
        torch.set_num_threads(threads)
    return out


def _without_seconds(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k != "seconds"}


@pytest.fixture
def small_blocks(monkeypatch):
    """Scan blocks of 128 rows, so the fixtures' ~900 tokens make several blocks for the threads."""
    import eyas.validate

    monkeypatch.setattr(eyas.validate, "SCAN_ROWS", 128)


def test_threads_give_the_same_manifest(reference_store, fp8_store, token_shard_path, small_blocks):
    for store in (reference_store, fp8_store):
        one = validate_store(token_shard_path, store, threads=1)
        assert HiddenStore(store).sample_offsets[-1] > 5 * 128  # several blocks
        assert _without_seconds(validate_store(token_shard_path, store, threads=3)) == _without_seconds(one)


FP8_BROKEN = {  # kind -> (array, rows, column, value written; text the StoreInvalid must hold)
    "nan_code_in_tap1": ("aux", slice(10, 13), "tap1", 0x7F, f"aux[1] layer {LAYER_IDS[1]}: 3 NaN, 0 Inf"),
    "nan_scale_of_final": ("scale", slice(300, 301), len(LAYER_IDS), np.nan, "final: {hidden} NaN, 0 Inf"),
    "inf_scale_of_tap0": (
        "scale",
        slice(5, 7),
        0,
        np.inf,
        f"aux[0] layer {LAYER_IDS[0]}: 0 NaN, {{twice}} Inf",
    ),
}


@pytest.mark.parametrize("kind", sorted(FP8_BROKEN))
def test_broken_fp8_store_is_refused_naming_the_tap(
    kind, fp8_store, token_shard_path, tmp_path, ledger, small_blocks
):
    store = tmp_path / fp8_store.name
    shutil.copytree(fp8_store, store)
    name, rows, column, value, message = FP8_BROKEN[kind]
    group = zarr.open_group(store, mode="r+")
    hidden = group.attrs["hidden_size"]
    with ledger.case("bad_input", f"fp8 hidden store: {kind}", "StoreInvalid naming the field/tap"):
        block = group[name][rows]
        block[:, hidden + 5 if column == "tap1" else column] = value
        group[name][rows] = block
        with pytest.raises(StoreInvalid) as err:
            validate_store(token_shard_path, store, threads=2)
        assert message.format(hidden=hidden, twice=2 * hidden) in str(err.value), str(err.value)


# --------------------------------------------------------------------------- exact counts, planted
PLANT_LENGTHS, PLANT_HIDDEN, PLANT_TAPS, PLANT_CHUNK = (40, 0, 100, 17, 143), 8, 3, 24  # 300 tokens
BF16_PLANTS = [  # (array, row, column in the array, bits): NaN and Inf of both signs, then finite extremes
    ("aux", 0, 3, 0x7FC1),  # tap 0: NaN (first row of the first block)
    ("aux", 95, 2 * PLANT_HIDDEN, 0xFFC0),  # tap 2: -NaN, last row of a 96-row block
    ("aux", 96, PLANT_HIDDEN + 7, 0x7F80),  # tap 1: +Inf, first row of the next block
    ("aux", 97, PLANT_HIDDEN, 0xFF81),  # tap 1: -NaN, the smallest NaN mantissa
    ("final", 150, 0, 0x7FFF),  # final: NaN, every mantissa bit
    ("final", 299, 5, 0xFF80),  # final: -Inf, last row of the partial last block
    ("aux", 10, 1, 0x7F7F),  # the largest finite value, and the most negative: not counted
    ("final", 11, 1, 0xFF7F),
]
BF16_COUNTS = [(1, 0), (1, 1), (1, 0), (1, 1)]  # (NaN, Inf) of taps 0, 1, 2 and the final state
FP8_PLANTS = [  # bits: 0x7F / 0xFF NaN; scales (the taps' then the final state's) NaN, Inf
    ("aux", 0, 3, 0x7F),
    ("aux", 95, 2 * PLANT_HIDDEN, 0xFF),
    ("final", 299, 5, 0x7F),
    ("scale", 96, 1, np.nan),  # tap 1's scale: `hidden` NaN values
    ("scale", 200, PLANT_TAPS, np.inf),  # the final state's scale: `hidden` Inf values
    ("scale", 299, 0, -np.inf),  # tap 0's scale, last row
    ("aux", 10, 1, 0x7E),  # the largest finite magnitudes, both signs: not counted
    ("final", 11, 1, 0xFE),
]
H = PLANT_HIDDEN
FP8_COUNTS = [(1, H), (H, 0), (1, 0), (1, H)]


def _planted_store(root: Path, storage: str, chunks_per_shard: int, plants: list) -> tuple[Path, Path]:
    """A token shard and a store of finite random values with `plants` written in; a store of 300
    tokens in 24-token chunks (13 chunks, an edge chunk), sharded `chunks_per_shard` a file."""
    from eyas.core.provenance import EYAS_VERSION, FINAL_NORM, sha256_array
    from eyas.store import hidden_store_writer, read_token_shard

    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 1000, n).astype(np.int32), np.ones(n, np.uint8)) for n in PLANT_LENGTHS]
    shard_attrs = {"tokenizer_hash": "t", "chat_template_hash": "c", "split": "train", "shard": 0,
                   "model_id": "planted"}  # fmt: skip
    write_token_shard(root / "tokens.zarr", samples, [f"s{i}" for i in range(len(samples))], shard_attrs)
    shard = read_token_shard(root / "tokens.zarr")
    attrs = {**shard_attrs, "model_hash": "0" * 64, "layer_ids": [1, 2, 3],
             "layer_id_convention": LAYER_ID_CONVENTION, "final_norm": FINAL_NORM,
             "tokens_checksum": sha256_array(shard.input_ids), "eyas_version": EYAS_VERSION}  # fmt: skip
    n, fp8 = int(shard.sample_offsets[-1]), storage == "fp8_e4m3"
    if fp8:  # finite e4m3 bits (magnitude below 0x7F, either sign) and finite scales
        bits = rng.integers(0, 0x7F, (n, PLANT_TAPS + 1, H)) | (
            rng.integers(0, 2, (n, PLANT_TAPS + 1, H)) << 7
        )
        bits = bits.astype(np.uint8)
        rows = {
            "aux": bits[:, :PLANT_TAPS].reshape(n, -1),
            "final": bits[:, PLANT_TAPS].copy(),
            "scale": rng.random((n, PLANT_TAPS + 1), np.float32),
        }
    else:
        from eyas.store import bf16_to_uint16

        rows = {
            "aux": bf16_to_uint16(torch.randn(n, PLANT_TAPS * H)),
            "final": bf16_to_uint16(torch.randn(n, H)),
        }
    for name, row, column, value in plants:
        rows[name][row, column] = value
    path = root / f"{storage}-{chunks_per_shard}.zarr"
    offsets = shard.sample_offsets
    with hidden_store_writer(
        path, offsets, H, PLANT_TAPS, attrs, PLANT_CHUNK, storage, chunks_per_shard
    ) as w:
        for i in range(len(PLANT_LENGTHS)):
            lo, hi = offsets[i], offsets[i + 1]
            w.write_sample(i, *(rows[name][lo:hi] for name in ("aux", "final", "scale") if name in rows))
    return root / "tokens.zarr", path


def _torch_counts(store: HiddenStore) -> list[tuple[int, int]]:
    """(NaN, Inf) per tap and final state, by torch on the values as stored (an independent check)."""
    n = int(store.sample_offsets[-1])
    aux, final = store.stored_rows("aux", 0, n), store.stored_rows("final", 0, n)
    parts = [aux[:, t * H : (t + 1) * H] for t in range(PLANT_TAPS)] + [final]
    if store.scale is None:
        values = [torch.from_numpy(p.copy()).view(torch.bfloat16) for p in parts]
        return [(int(v.isnan().sum()), int(v.isinf().sum())) for v in values]
    scale = torch.from_numpy(store.stored_rows("scale", 0, n))
    values = [torch.from_numpy(p.copy()).view(torch.float8_e4m3fn).float() for p in parts]
    return [
        (int(v.isnan().sum()) + H * int(scale[:, j].isnan().sum()), H * int(scale[:, j].isinf().sum()))
        for j, v in enumerate(values)
    ]


@pytest.mark.parametrize("scan_rows", [96, 100])  # blocks of whole chunks (4), and blocks across chunks
@pytest.mark.parametrize("chunks_per_shard", [1, 4])
@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_planted_nan_and_inf_are_counted_exactly(tmp_path, monkeypatch, storage, chunks_per_shard, scan_rows):
    """NaN and Inf planted in several taps and the final state, at block edges and in the partial last
    block (fp8: also in the per-token scales, `hidden` values each): the manifest's counts per tap are
    exactly the planted ones and torch's on the stored values, at any thread count."""
    import eyas.validate
    from eyas.validate import _scan_nonfinite

    monkeypatch.setattr(eyas.validate, "SCAN_ROWS", scan_rows)
    plants, expected = (BF16_PLANTS, BF16_COUNTS) if storage == "bf16" else (FP8_PLANTS, FP8_COUNTS)
    tokens, path = _planted_store(tmp_path, storage, chunks_per_shard, plants)
    store = HiddenStore(path)
    assert (store.aux.shards is not None) == (chunks_per_shard > 1)
    assert _torch_counts(store) == expected
    names = [f"aux[{i}] layer {i + 1}" for i in range(PLANT_TAPS)] + ["final"]
    want = {name: {"nan": nan, "inf": inf} for name, (nan, inf) in zip(names, expected, strict=True)}
    for threads in (1, 3):
        with ThreadPoolExecutor(threads) as pool:
            assert _scan_nonfinite(store, PLANT_TAPS, H, pool) == want
    with pytest.raises(StoreInvalid) as err:
        validate_store(tokens, path, threads=2)
    for name, (nan, inf) in zip(names, expected, strict=True):
        assert f"{name}: {nan} NaN, {inf} Inf values" in str(err.value), str(err.value)


@pytest.mark.parametrize("storage", ["bf16", "fp8_e4m3"])
def test_a_store_without_plants_passes_with_zero_counts(tmp_path, monkeypatch, storage):
    """The same store with only finite values (the extremes kept): validated, every count zero."""
    import eyas.validate

    monkeypatch.setattr(eyas.validate, "SCAN_ROWS", 96)
    extremes = (BF16_PLANTS if storage == "bf16" else FP8_PLANTS)[-2:]
    tokens, path = _planted_store(tmp_path, storage, 4, extremes)
    manifest = validate_store(tokens, path, threads=2)
    assert len(manifest["nonfinite"]) == PLANT_TAPS + 1
    assert all(c == {"nan": 0, "inf": 0} for c in manifest["nonfinite"].values())
