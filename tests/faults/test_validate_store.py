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
