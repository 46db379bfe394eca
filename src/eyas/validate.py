"""Validate a hidden store against its token shard and record a manifest that training checks.

A store that exists is complete (atomic rename), but it can still be wrong: extracted from another
shard or model, chunks lost on a bad disk or by a hand copy (a missing chunk reads back as zeros,
silently), NaN/Inf from an overflowing target. `validate_store` checks all of it and returns the
manifest: provenance, shapes, NaN/Inf counts per tap, and per array a sha256 over the stored (encoded)
chunk files (a hash of each file's hash, `chunk_summary`). `check_manifest` is the cheap check a consumer
runs before reading a store (manifest present and passed, store attrs unchanged, chunk files' count and
bytes unchanged: stat only); `verify_manifest` re-hashes every chunk file.

The store is read through `eyas.store.HiddenStore` and its attrs only, and scanned bit-wise as stored,
in blocks of rows spread over `threads` threads (the chunk files are hashed on the same threads): a bf16
value (uint16 bits) is non-finite iff its exponent bits are all ones (NaN: mantissa non-zero, Inf:
mantissa zero); an fp8 e4m3fn value (uint8) is NaN iff its exponent and mantissa bits are all ones (it
has no Inf), and a row whose per-token scale is NaN or Inf adds `hidden_size` NaN or Inf values (roughly
what it dequantizes to: a zero times Inf is NaN; any count fails the store either way).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from eyas.core.atomic import atomic_file
from eyas.core.layer_ids import LAYER_ID_CONVENTION
from eyas.core.provenance import EYAS_VERSION, FINAL_NORM, sha256_array
from eyas.store import (
    REQUIRED_ATTRS,
    SHARD_FIELDS,
    STORED_DTYPES,
    HiddenStore,
    TokenShard,
    hidden_layout,
    read_token_shard,
)

# /2: an array's sha256 is over its files' own sha256s (`chunk_summary`); /1's was one stream of their bytes
MANIFEST_FORMAT = "eyas.manifest/2"
BF16_EXPONENT = 0x7F80  # bf16 bits: sign 1, exponent 8, mantissa 7
BF16_MANTISSA = 0x007F
FP8_NAN = 0x7F  # e4m3fn bits: sign 1, exponent 4, mantissa 3; S.1111.111 is NaN, there is no Inf
SCAN_ROWS = 4096  # tokens per block of the NaN/Inf scan: bounded memory, whole 256-token chunks


class StoreInvalid(ValueError):
    """A hidden store failed validation, or its manifest is missing, failed or stale."""


# --------------------------------------------------------------------------- pure helpers
def nonfinite_bf16(bits: np.ndarray) -> tuple[int, int]:
    """(NaN count, Inf count) of bf16 values given as their uint16 bits."""
    bits = np.asarray(bits, dtype=np.uint16)
    special = (bits & BF16_EXPONENT) == BF16_EXPONENT
    nan = int(np.count_nonzero(special & ((bits & BF16_MANTISSA) != 0)))
    return nan, int(np.count_nonzero(special)) - nan


def nonfinite_fp8(bits: np.ndarray) -> int:
    """NaN count of fp8 e4m3fn values given as their uint8 bits (the format has no Inf)."""
    return int(np.count_nonzero((np.asarray(bits, dtype=np.uint8) & FP8_NAN) == FP8_NAN))


def attrs_sha256(attrs: Mapping) -> str:
    return hashlib.sha256(json.dumps(dict(attrs), sort_keys=True, default=str).encode()).hexdigest()


def _array_files(store: Path, name: str) -> list[Path]:
    folder = store / name
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def file_sha256(path: Path) -> str:
    """sha256 of one file, read in blocks: hashlib drops the GIL for each, so files hash on many threads."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _tree_digest(store: Path, files: list[Path], file_hashes: Iterable[str]) -> str:
    """sha256 over a line `relative path \\0 sha256 of the file \\n` per file, in path order: as strong
    as one stream over every file's path and bytes, but the files' hashes can be taken at once."""
    digest = hashlib.sha256()
    for path, file_hash in zip(files, file_hashes, strict=True):
        digest.update(f"{path.relative_to(store).as_posix()}\0{file_hash}\n".encode())
    return digest.hexdigest()


def _pending_summary(store: Path, name: str, hash_bytes: bool, pool: Executor | None) -> Callable[[], dict]:
    """Stat array `name`'s files and queue their hashes on `pool` (none: hashed in this thread when
    asked); the returned call gives `chunk_summary`, waiting for the hashes. Queuing them all before
    waiting lets the caller queue other work (the NaN/Inf scan) behind them."""
    files = _array_files(store, name)
    summary = {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}
    if not hash_bytes:
        return lambda: summary
    futures = [pool.submit(file_sha256, p) for p in files] if pool is not None else None

    def result() -> dict:
        hashes = map(file_sha256, files) if futures is None else (f.result() for f in futures)
        return {**summary, "sha256": _tree_digest(store, files, hashes)}

    return result


def chunk_summary(
    store: str | os.PathLike, name: str, hash_bytes: bool = True, pool: Executor | None = None
) -> dict:
    """Files, bytes and (optionally) the sha256 of every stored file of array `name` (its chunk files
    and metadata): `_tree_digest` of each file's own sha256, taken on `pool`'s threads if given."""
    return _pending_summary(Path(store), name, hash_bytes, pool)()


@contextlib.contextmanager
def _pool(threads: int, prefix: str) -> Iterator[ThreadPoolExecutor]:
    """A thread pool whose queued tasks are dropped when it is left, so that a failure (a corrupt chunk,
    a mismatch, a signal) waits only for the tasks already running, not for every file's hash."""
    pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix=prefix)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- validation
def _tap_names(attrs: Mapping) -> list[str]:
    return [f"aux[{i}] layer {v}" for i, v in enumerate(attrs.get("layer_ids") or [])]


class _BlockScan:
    """NaN/Inf counts of one store's blocks of SCAN_ROWS rows, called on any pool thread.

    Each thread reads its blocks into its own buffers, reused block after block, and tests each block
    whole, in place: its values' sign bits cleared, then one max (a value is non-finite iff its
    magnitude bits are at least `special`). No array is allocated per block: fresh multi-MB arrays may
    be mapped and page-faulted in anew, which serializes threads on the process's memory map, and the
    masked copies and bool arrays of counting each tap's strided columns cost a quarter (fp8) to a half
    (bf16) of decoding the block. Only a block with a non-finite value, rare, is counted tap by tap
    (the sign changes no count).
    """

    def __init__(self, store: HiddenStore, num_taps: int, hidden: int):
        self.store, self.num_taps, self.hidden = store, num_taps, hidden
        fp8 = store.scale is not None
        self.magnitude_mask, self.special = (0x7F, FP8_NAN) if fp8 else (0x7FFF, BF16_EXPONENT)
        self.layout = hidden_layout(store.storage, hidden, num_taps)  # name -> (width, on-disk dtype)
        self._local = threading.local()  # per thread: {array name: [SCAN_ROWS, width] buffer}

    def _read(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Rows [lo, hi) of each array, as stored, in this thread's buffers."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {
                name: np.empty((SCAN_ROWS, width), dtype) for name, (width, dtype) in self.layout.items()
            }
        store = self.store
        return {name: store.stored_rows(name, lo, hi, out=buf[: hi - lo]) for name, buf in buffers.items()}

    def __call__(self, lo: int) -> list[tuple[int, int]]:
        """(NaN, Inf) of each tap and of the final state in rows [lo, lo + SCAN_ROWS) of the store."""
        hi = min(lo + SCAN_ROWS, int(self.store.sample_offsets[-1]))
        rows = self._read(lo, hi)  # aux [rows, K*H], final [rows, H], fp8: scale [rows, K+1] float32
        aux, final, scale = rows["aux"], rows["final"], rows.get("scale")
        for bits in (aux, final):
            np.bitwise_and(bits, self.magnitude_mask, out=bits)
        finite_scale = scale is None or bool(np.isfinite(scale).all())
        if finite_scale and max(int(aux.max(initial=0)), int(final.max(initial=0))) < self.special:
            return [(0, 0)] * (self.num_taps + 1)
        hidden = self.hidden
        parts = [aux[:, tap * hidden : (tap + 1) * hidden] for tap in range(self.num_taps)] + [final]
        if scale is None:
            return [nonfinite_bf16(part) for part in parts]
        return [
            (
                nonfinite_fp8(part) + hidden * int(np.isnan(scale[:, j]).sum()),
                hidden * int(np.isinf(scale[:, j]).sum()),
            )
            for j, part in enumerate(parts)
        ]


def _scan_nonfinite(store: HiddenStore, num_taps: int, hidden: int, pool: ThreadPoolExecutor) -> dict:
    names = [*_tap_names(store.attrs)[:num_taps], "final"]
    counts = {name: {"nan": 0, "inf": 0} for name in names}
    scan = _BlockScan(store, num_taps, hidden)
    futures = [pool.submit(scan, lo) for lo in range(0, int(store.sample_offsets[-1]), SCAN_ROWS)]
    try:
        for future in futures:
            for name, (nan, inf) in zip(names, future.result(), strict=True):
                counts[name]["nan"] += nan
                counts[name]["inf"] += inf
    except BaseException:  # a block that fails (a corrupt chunk, a signal): the rest is not waited for
        for future in futures:
            future.cancel()
        raise
    return counts


class _Problems(list):
    """The problems found so far, in the order checked; each names the field."""

    def expect(self, field: str, have, want, why: str) -> None:
        if have != want:
            self.append(f"field {field!r} is {have!r}, expected {want!r} ({why})")


def _open_store(hidden_store: str | os.PathLike) -> HiddenStore:
    try:
        return HiddenStore(hidden_store)
    except Exception as err:  # not a zarr group, or not an eyas store
        raise StoreInvalid(f"{os.fspath(hidden_store)}: cannot be opened as a hidden store: {err}") from err


def _check_provenance(
    problems: _Problems, store: HiddenStore, shard: TokenShard, expected: Mapping | None
) -> None:
    """Provenance fields present; counts, checksum, shard fields and sample offsets those of the token
    shard; the conventions eyas reads by; the tap count; and the `expected` provenance."""
    attrs = store.attrs
    missing = [f for f in REQUIRED_ATTRS if f not in attrs]
    if missing:
        problems.append(f"provenance fields missing: {missing}")
    expect = problems.expect
    expect("num_samples", attrs.get("num_samples"), shard.num_samples, "token shard's samples")
    expect("num_tokens", attrs.get("num_tokens"), len(shard.input_ids), "token shard's input_ids")
    expect("tokens_checksum", attrs.get("tokens_checksum"), sha256_array(shard.input_ids), "token shard")
    for field in SHARD_FIELDS:
        if field in shard.attrs:
            expect(field, attrs.get(field), shard.attrs[field], "token shard attrs")
    if not np.array_equal(store.sample_offsets, shard.sample_offsets):
        problems.append("array 'sample_offsets' differs from the token shard's")
    expect("layer_id_convention", attrs.get("layer_id_convention"), LAYER_ID_CONVENTION, "docs/design.md")
    expect("final_norm", attrs.get("final_norm"), FINAL_NORM, "docs/design.md")
    expect("num_taps", int(attrs.get("num_taps") or 0), len(attrs.get("layer_ids") or []), "len(layer_ids)")
    for field, want in (expected or {}).items():
        expect(
            field, attrs.get(field), list(want) if isinstance(want, tuple) else want, "expected provenance"
        )


def _check_arrays(
    problems: _Problems,
    store: HiddenStore,
    num_tokens: int,
    num_taps: int,
    hidden: int,
) -> dict:
    """Each array's shape, dtype and chunks on disk; returns the manifest's `arrays` (without the
    summary of their files)."""
    attrs = store.attrs
    arrays = {}
    # name -> (row width, on-disk dtype); fp8_e4m3 adds per-token scales of each tap and the final state
    layout = hidden_layout(store.storage, hidden, num_taps)
    checked = [(name, getattr(store, name), width, dtype) for name, (width, dtype) in layout.items()]
    if "dtype" in attrs:
        problems.expect("dtype", attrs["dtype"], STORED_DTYPES[store.storage], f"storage {store.storage}")
    for name, array, width, dtype in checked:
        problems.expect(f"{name}.shape", tuple(array.shape), (num_tokens, width), "tokens x width from attrs")
        want = np.dtype(dtype).name
        problems.expect(f"{name}.dtype", str(array.dtype), want, f"{store.storage} is stored as {want}")
        try:
            missing = store.missing_chunks(name)
        except ValueError as err:
            problems.append(f"array {name!r}: {err}")
            missing = 0
        if missing:
            problems.append(
                f"array {name!r}: {missing} of {array.nchunks} chunks "
                "missing on disk (they would read back as zeros)"
            )
        arrays[name] = {"shape": list(array.shape), "dtype": str(array.dtype), "chunks": list(array.chunks)}
    return arrays


def _check_finite(
    problems: _Problems, store: HiddenStore, num_taps: int, hidden: int, pool: ThreadPoolExecutor
) -> dict[str, dict[str, int]]:
    """NaN/Inf counts per tap and of the final state (the manifest's `nonfinite`); any is a problem."""
    nonfinite = _scan_nonfinite(store, num_taps, hidden, pool)
    for tap, counts in nonfinite.items():
        if counts["nan"] or counts["inf"]:
            problems.append(f"{tap}: {counts['nan']} NaN, {counts['inf']} Inf values")
    return nonfinite


def validate_store(
    token_shard: str | os.PathLike,
    hidden_store: str | os.PathLike,
    expected: Mapping | None = None,
    threads: int = 1,
) -> dict:
    """Check `hidden_store` against `token_shard` (and `expected` provenance); return its manifest.
    `threads` hash the stored files and read and scan blocks of rows at once; the manifest is the same.

    Raises `StoreInvalid` listing every problem found (each names the field).
    """
    started = time.perf_counter()
    where = os.fspath(hidden_store)
    store = _open_store(hidden_store)
    shard = read_token_shard(token_shard)
    problems = _Problems()
    _check_provenance(problems, store, shard, expected)
    num_taps, hidden = int(store.attrs.get("num_taps") or 0), int(store.attrs.get("hidden_size") or 0)
    arrays = _check_arrays(problems, store, len(shard.input_ids), num_taps, hidden)
    nonfinite = {}
    if not problems:  # a scan or hash of a store of the wrong shape would only add noise (and time)
        with _pool(threads, "validate") as pool:
            # the files' hashes are queued first, the scan's blocks behind them, on the same threads
            summaries = {name: _pending_summary(store.path, name, True, pool) for name in arrays}
            nonfinite = _check_finite(problems, store, num_taps, hidden, pool)
            if not problems:  # a store that failed needs no digest: leaving the pool drops the hashes
                for name, summary in summaries.items():
                    arrays[name].update(summary())
    if problems:
        raise StoreInvalid(f"{where} (token shard {os.fspath(token_shard)}): " + "; ".join(problems))
    return {
        "format": MANIFEST_FORMAT,
        "store": where,
        "store_name": Path(hidden_store).name,
        "token_shard": os.fspath(token_shard),
        "attrs_sha256": attrs_sha256(store.attrs),
        "provenance": {f: store.attrs.get(f) for f in REQUIRED_ATTRS},
        "arrays": arrays,
        "nonfinite": nonfinite,
        "ok": True,
        "validated_by": EYAS_VERSION,
        "seconds": round(time.perf_counter() - started, 3),
    }


def write_manifest(path: str | os.PathLike, manifest: Mapping) -> None:
    with atomic_file(path) as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")


# --------------------------------------------------------------------------- consumers
def _load_manifest(store: Path, manifest_path: str | os.PathLike) -> dict:
    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except FileNotFoundError:
        raise StoreInvalid(f"{store}: no manifest at {manifest_path}: run the validate rule first") from None
    except json.JSONDecodeError as err:
        raise StoreInvalid(f"{manifest_path}: not valid JSON ({err})") from None
    if manifest.get("format") != MANIFEST_FORMAT:  # an older format's sha256 meant something else
        raise StoreInvalid(
            f"{manifest_path}: field 'format' is {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}: "
            "validate the store again (remove this manifest and run the validate rule)"
        )
    if manifest.get("ok") is not True:
        raise StoreInvalid(f"{manifest_path}: field 'ok' is {manifest.get('ok')!r}, expected true")
    if manifest.get("store_name") != store.name:
        raise StoreInvalid(
            f"{manifest_path}: field 'store_name' is {manifest.get('store_name')!r}, not {store.name!r}"
        )
    return manifest


def check_manifest(hidden_store: str | os.PathLike, manifest_path: str | os.PathLike) -> dict:
    """Refuse a store whose manifest is missing, failed, or no longer matches it (attrs, chunk files'
    count and bytes). Cheap: reads the attrs and stats the files."""
    store = Path(hidden_store)
    manifest = _load_manifest(store, manifest_path)
    have = attrs_sha256(HiddenStore(store).attrs)
    if have != manifest["attrs_sha256"]:
        raise StoreInvalid(
            f"{store}: field 'attrs_sha256' is {have}, the manifest {manifest_path} has another"
        )
    for name, recorded in manifest["arrays"].items():
        now = chunk_summary(store, name, hash_bytes=False)
        for field in ("files", "bytes"):
            if now[field] != recorded[field]:
                raise StoreInvalid(
                    f"{store}: array {name!r} field {field!r} is {now[field]}, manifest {manifest_path} "
                    f"recorded {recorded[field]}: the store changed since it was validated"
                )
    return manifest


def verify_manifest(
    hidden_store: str | os.PathLike, manifest_path: str | os.PathLike, threads: int = 1
) -> dict:
    """`check_manifest` plus a re-hash of every stored chunk file, on `threads` threads."""
    manifest = check_manifest(hidden_store, manifest_path)
    store = Path(hidden_store)
    with _pool(threads, "verify") as pool:
        summaries = {name: _pending_summary(store, name, True, pool) for name in manifest["arrays"]}
        for name, recorded in manifest["arrays"].items():
            if summaries[name]()["sha256"] != recorded["sha256"]:
                raise StoreInvalid(
                    f"{hidden_store}: array {name!r} field 'sha256' differs from {manifest_path}"
                )
    return manifest


def check_manifests(hidden_stores: list[str], manifests: list[str]) -> None:
    """Every store must have a passing, current manifest (the train rule's inputs, in order)."""
    if len(hidden_stores) != len(manifests):
        raise StoreInvalid(f"{len(hidden_stores)} hidden stores but {len(manifests)} manifests")
    for store, manifest in zip(hidden_stores, manifests, strict=True):
        check_manifest(store, manifest)
