"""Store validation speed (eyas.validate.validate_store) by storage and thread count, side by side.

Writes a token shard and a bf16 and an fp8 hidden store of the same synthetic states (normal values,
the recipe's shape by default: hidden 576, 3 taps), then times `validate_store` on each at every
`--threads` value and checks that every manifest of a tree is the same but for its seconds. Stored GB/s
is what the GPU recipe's one validation job per split reads (docs/gpu-kit.md budgets it).
`--compare-src` times another tree's validate_store on the same stores, at each `--threads` value its
signature takes; its manifests must equal this tree's but for the format and the arrays' sha256 (whose
definition the format names: eyas.manifest/1 hashed one stream per array, /2 a hash of file hashes).

    python bench/validate.py --tokens 400000 --threads 1 2 --out bench/results/validate-cpu.json \
        --compare-src /path/to/older/checkout/src   # also times that tree's validate_store, same inputs

`--chunks-per-shard 16` shards the synthetic stores as the GPU recipe does (one file per 16 chunks),
`--compression none` stores them uncompressed (`extract.compression`); `--work DIR` keeps them, for
`--store` runs after.

A run's own store instead of synthetic ones (`--store` with its `--token-shard`): `validate_store` at
each `--threads` value, then its two parts alone, to tell which one bounds it on that machine: the
chunk files' sha256 (`chunk_summary`, the files hashed on a pool) and the NaN/Inf scan, each at each
thread count; with `--compare-src`, that tree's scan alone is timed too, on the same store.

    python bench/validate.py --store RUN/results/hidden/train/shard-00000.zarr \
        --token-shard RUN/results/tokens/train/shard-00000.zarr --threads 1 8 16 --out validate-run.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from eyas.core.layer_ids import LAYER_ID_CONVENTION
from eyas.core.provenance import EYAS_VERSION, FINAL_NORM, sha256_array
from eyas.extract.job import stored_bytes
from eyas.store import COMPRESSIONS, HiddenStore, hidden_store_writer, read_token_shard, write_token_shard
from eyas.store.layout import bf16_to_uint16
from eyas.store.quant import fp8_quantize
from eyas.validate import _scan_nonfinite, chunk_summary, validate_store

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from gpubench import machine, write_json  # noqa: E402

SAMPLE_TOKENS = 1024


def write_inputs(
    root: Path, tokens: int, hidden: int, taps: int, chunks_per_shard: int = 1, compression: str = "zstd"
) -> tuple[Path, dict[str, Path]]:
    """A token shard of `tokens` tokens and a bf16 and an fp8 store of the same states, each
    `chunks_per_shard` chunks a file (the GPU recipe shards 16), chunks stored by `compression`."""
    rng = np.random.default_rng(0)
    lengths = [SAMPLE_TOKENS] * (tokens // SAMPLE_TOKENS) + (
        [tokens % SAMPLE_TOKENS] if tokens % SAMPLE_TOKENS else []
    )
    samples = [(rng.integers(0, 49152, n).astype(np.int32), np.ones(n, np.uint8)) for n in lengths]
    shard_attrs = {"tokenizer_hash": "bench", "chat_template_hash": "bench", "split": "train", "shard": 0,
                   "model_id": "synthetic"}  # fmt: skip
    shard_path = root / "tokens.zarr"
    write_token_shard(shard_path, samples, [f"s{i}" for i in range(len(samples))], shard_attrs)
    shard = read_token_shard(shard_path)
    attrs = {**shard_attrs, "model_hash": "0" * 64, "layer_ids": list(range(1, taps + 1)),
             "layer_id_convention": LAYER_ID_CONVENTION, "final_norm": FINAL_NORM,
             "tokens_checksum": sha256_array(shard.input_ids), "eyas_version": EYAS_VERSION}  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    stores = {}
    for storage in ("bf16", "fp8_e4m3"):
        stores[storage] = root / f"{storage}.zarr"
        layout = {"storage": storage, "chunks_per_shard": chunks_per_shard, "compression": compression}
        with hidden_store_writer(stores[storage], shard.sample_offsets, hidden, taps, attrs, **layout) as w:
            for index, n in enumerate(lengths):
                states = torch.randn(n, taps + 1, hidden, generator=generator)  # [T, K+1, H]
                if storage == "bf16":
                    bits = bf16_to_uint16(states)
                    w.write_sample(index, bits[:, :taps].reshape(n, -1), bits[:, taps])
                else:
                    values, scale = fp8_quantize(states)  # [T, K+1, H] e4m3, [T, K+1]
                    bits = values.view(torch.uint8).numpy()
                    w.write_sample(index, bits[:, :taps].reshape(n, -1), bits[:, taps], scale.numpy())
    return shard_path, stores


TIME_OTHER = """
import inspect, json, sys, time
sys.path.insert(0, sys.argv[1])
from eyas.validate import validate_store
threads = int(sys.argv[4])
takes_threads = "threads" in inspect.signature(validate_store).parameters
if threads != 1 and not takes_threads:
    print(json.dumps(None))
    sys.exit()
started = time.perf_counter()
manifest = validate_store(sys.argv[2], sys.argv[3], **({"threads": threads} if takes_threads else {}))
seconds = time.perf_counter() - started
manifest.pop("seconds")
print(json.dumps({"seconds": seconds, "manifest": manifest}))
"""


TIME_OTHER_SCAN = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
from eyas.store import HiddenStore
from eyas.validate import _scan_nonfinite
store = HiddenStore(sys.argv[2])
taps, hidden = int(store.attrs["num_taps"]), int(store.attrs["hidden_size"])
with ThreadPoolExecutor(int(sys.argv[3])) as pool:
    started = time.perf_counter()
    counts = _scan_nonfinite(store, taps, hidden, pool)
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "nonfinite": counts}))
"""


def time_other(src: str, shard: Path, store: Path, threads: int) -> tuple[float, dict] | None:
    """Seconds and manifest of `validate_store` from another source tree at `threads` threads; None
    where its signature takes no threads (an older tree) and `threads` is not 1."""
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", TIME_OTHER, src, str(shard), str(store), str(threads)],
                         env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    result = json.loads(out.splitlines()[-1])
    return None if result is None else (result["seconds"], result["manifest"])


def across_formats(manifest: dict) -> dict:
    """What a manifest of any format must share with another of the same store: all but its seconds,
    format and the arrays' sha256 (its definition is what the format names)."""
    arrays = {name: {k: v for k, v in a.items() if k != "sha256"} for name, a in manifest["arrays"].items()}
    return {k: v for k, v in manifest.items() if k not in ("seconds", "format")} | {"arrays": arrays}


def commit_of(path: str | Path) -> str:
    """The git commit of the checkout holding `path`, with "+changes" when its tree differs from it."""
    git = ["git", "-C", str(path)]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return (head or "unknown") + ("+changes" if dirty.stdout.strip() else "")


def time_scan(store: Path, threads: int, src: str | None = None) -> tuple[float, dict]:
    """Seconds and counts of the NaN/Inf scan alone (`_scan_nonfinite`) of `store` on a pool of
    `threads`, by this tree or, given `src`, by that tree's code in a child process."""
    if src is None:
        opened = HiddenStore(store)
        taps, hidden = int(opened.attrs["num_taps"]), int(opened.attrs["hidden_size"])
        with ThreadPoolExecutor(threads) as pool:
            started = time.perf_counter()
            counts = _scan_nonfinite(opened, taps, hidden, pool)
            return time.perf_counter() - started, counts
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", TIME_OTHER_SCAN, src, str(store), str(threads)],
                         env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    result = json.loads(out.splitlines()[-1])
    return result["seconds"], result["nonfinite"]


def time_run_store(
    shard: Path, store: Path, threads: list[int], compare: tuple[str, str] | None = None
) -> dict:
    """validate_store on an existing store at each thread count, then its hash and its scan alone (the
    scan also by the tree `compare` = (its src, its name), first, where given)."""
    gb = stored_bytes(store) / 1e9
    runs = []
    for count in threads:
        started = time.perf_counter()
        validate_store(shard, store, threads=count)
        seconds = time.perf_counter() - started
        runs.append(
            {"threads": count, "seconds": round(seconds, 3), "stored_gb_per_s": round(gb / seconds, 3)}
        )
        print(json.dumps(runs[-1]), flush=True)
    opened = HiddenStore(store)
    hashes = {}
    for name in ("aux", "final", "scale") if opened.scale is not None else ("aux", "final"):
        for count in threads:
            with ThreadPoolExecutor(count) as pool:
                started = time.perf_counter()
                summary = chunk_summary(store, name, pool=pool)
                seconds = round(time.perf_counter() - started, 3)
            hashes.setdefault(name, {"files": summary["files"], "bytes": summary["bytes"], "by_threads": []})
            hashes[name]["by_threads"].append({"threads": count, "seconds": seconds})
    scans, counts = [], []
    trees = ([(compare[1] + " (--compare-src)", compare[0])] if compare else []) + [
        (f"{commit_of(Path(__file__).parent)} (this tree)", None)
    ]
    for code, src in trees:
        for count in threads:
            seconds, nonfinite = time_scan(store, count, src)
            counts.append(nonfinite)
            scans.append({"code": code, "threads": count, "seconds": round(seconds, 3),
                          "stored_gb_per_s": round(gb / seconds, 3),
                          "stored_gb_per_s_per_thread": round(gb / seconds / count, 3)})  # fmt: skip
            print(json.dumps(scans[-1]), flush=True)
    assert all(c == counts[0] for c in counts), "the scans' NaN/Inf counts differ"
    return {"store": str(store), "stored_gb": round(gb, 3), "tokens": int(opened.sample_offsets[-1]),
            "storage": opened.storage, "validate_store": runs, "sha256_alone_by_array": hashes,
            "scan_alone": scans, "nonfinite": counts[0]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--taps", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--chunks-per-shard", type=int, default=1, help="synthetic stores sharded so (the GPU recipe: 16)"
    )
    parser.add_argument(
        "--compression",
        default="zstd",
        choices=COMPRESSIONS,
        help="synthetic stores' extract.compression",
    )
    parser.add_argument("--compare-src", help="another checkout's src/: its validate_store timed first")
    parser.add_argument(
        "--compare-name", help="what --compare-src is called in the runs (default: its git commit)"
    )
    parser.add_argument("--work", help="where the inputs go (default: a temporary folder, removed)")
    parser.add_argument("--store", type=Path, help="time this existing hidden store instead")
    parser.add_argument("--token-shard", type=Path, help="the token shard of --store")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.store:
        if not args.token_shard:
            parser.error("--store needs its --token-shard")
        compare = (
            (args.compare_src, args.compare_name or commit_of(args.compare_src)) if args.compare_src else None
        )
        result = time_run_store(args.token_shard, args.store, args.threads, compare)
        write_json(Path(args.out), {"what": "validate_store and its parts on an existing store (--store)",
                                    "machine": machine(), **result})  # fmt: skip
        return
    root = Path(args.work or tempfile.mkdtemp(prefix="eyas-validate-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        shard, stores = write_inputs(
            root, args.tokens, args.hidden, args.taps, args.chunks_per_shard, args.compression
        )
        runs, this_commit = [], commit_of(Path(__file__).parent)
        for storage, store in stores.items():
            manifests: dict[str, list[dict]] = {}  # by tree

            def record(code: str, threads: int, seconds: float, manifest: dict) -> None:
                kept = {k: v for k, v in manifest.items() if k != "seconds"}
                manifests.setdefault(code, []).append(kept)  # noqa: B023
                gb = stored_bytes(store) / 1e9  # noqa: B023 (called within this iteration)
                runs.append({"storage": storage, "code": code, "threads": threads,  # noqa: B023
                             "seconds": round(seconds, 3), "stored_gb": round(gb, 3),
                             "stored_gb_per_s": round(gb / seconds, 3)})  # fmt: skip
                print(json.dumps(runs[-1]), flush=True)

            for threads in args.threads if args.compare_src else ():
                timed = time_other(args.compare_src, shard, store, threads)
                if timed is not None:
                    name = args.compare_name or commit_of(args.compare_src)
                    record(f"{name} (--compare-src)", threads, *timed)
            for threads in args.threads:
                started = time.perf_counter()
                manifest = validate_store(shard, store, threads=threads)
                record(f"{this_commit} (this tree)", threads, time.perf_counter() - started, manifest)
            for code, same_tree in manifests.items():
                assert all(m == same_tree[0] for m in same_tree), f"{storage} {code}: the manifests differ"
            first = across_formats(next(iter(manifests.values()))[0])
            assert all(across_formats(m[0]) == first for m in manifests.values()), f"{storage}: trees differ"
    finally:
        if not args.work:
            shutil.rmtree(root, ignore_errors=True)
    for run in runs:
        first = next(r for r in runs if r["storage"] == run["storage"])
        run["speedup_vs_first"] = round(first["seconds"] / run["seconds"], 2)
    write_json(Path(args.out), {
        "what": "validate_store on synthetic normal states, same tokens in both storages; a tree's manifests "
        "equal at every thread count; across trees equal but for the format and the arrays' sha256",
        "tokens": args.tokens, "hidden_size": args.hidden, "taps": args.taps,
        "chunks_per_shard": args.chunks_per_shard, "compression": args.compression,
        "machine": machine(),
        "runs": runs,
    })  # fmt: skip


if __name__ == "__main__":
    main()
