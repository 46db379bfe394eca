"""Chunk shape of hidden stores, by measurement on real states: write speed, compression ratio, files
and random whole-sample read speed and amplification, for several tokens-per-chunk values, sharded or
not (`256x16`: 256-token chunks, 16 of them a shard file; `extract.chunks_per_shard`).

    .venv/bin/python bench/chunks.py --store results/hidden/train/shard-00001.zarr \
        --out bench/results/chunks-cpu.json
    .venv/bin/python bench/chunks.py --store STORE --chunks 256,256x16,4096 --out OUT

Reads a finished store (real target states), rewrites it with each chunk size through the same
writer extraction uses (one thread, so speeds compare), then reads `--reads` random whole samples
from a cold-ish store (a fresh open; the page cache is not dropped, so read speeds are upper bounds).
Amplification = bytes of the chunks a read decodes / bytes of the rows it needs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eyas.store import HiddenStore, hidden_store_writer


def rewrite(source: HiddenStore, out: Path, chunk_tokens: int, chunks_per_shard: int = 1) -> float:
    # [N, K*H], [N, H] bits (uint16 bf16, uint8 e4m3) and [N, K+1] scales (fp8), read once up front
    aux, final = source.aux[:], source.final[:]
    scale = source.scale[:] if source.scale is not None else None
    offsets = source.sample_offsets
    taps, hidden = source.attrs["num_taps"], source.attrs["hidden_size"]
    start = time.perf_counter()
    with hidden_store_writer(
        out, offsets, hidden, taps, {}, chunk_tokens, source.storage, chunks_per_shard
    ) as writer:
        for s in range(len(offsets) - 1):
            lo, hi = offsets[s], offsets[s + 1]
            writer.write_sample(s, aux[lo:hi], final[lo:hi], *(() if scale is None else (scale[lo:hi],)))
    return time.perf_counter() - start


def stored_row_bytes(store: HiddenStore) -> int:
    arrays = [a for a in (store.aux, store.final, store.scale) if a is not None]
    return sum(a.shape[1] * a.dtype.itemsize for a in arrays)


def random_reads(path: Path, reads: int, seed: int) -> dict:
    store = HiddenStore(path)
    offsets, chunk = store.sample_offsets, store.attrs["chunk_tokens"]
    row_bytes = stored_row_bytes(store)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, store.num_samples, reads)
    needed = decoded = 0
    start = time.perf_counter()
    for s in picks:
        store.sample(int(s))
        lo, hi = int(offsets[s]), int(offsets[s + 1])
        needed += (hi - lo) * row_bytes
        if hi > lo:
            decoded += ((hi - 1) // chunk - lo // chunk + 1) * chunk * row_bytes
    seconds = time.perf_counter() - start
    return {"read_mb_per_s": needed / seconds / 1e6, "read_amplification": decoded / max(needed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="a finished hidden store of real states")
    parser.add_argument("--chunks", default="64,128,256,512,1024,2048")
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    source = HiddenStore(args.store)
    raw = source.attrs["num_tokens"] * stored_row_bytes(source)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.chunks.split(","):
            chunk, _, per_shard = layout.partition("x")
            chunk, per_shard = int(chunk), int(per_shard or 1)
            out = Path(tmp) / f"c{layout}.zarr"
            seconds = rewrite(source, out, chunk, per_shard)
            files = [f for f in out.rglob("*") if f.is_file() and "/c/" in str(f)]
            stored = sum(f.stat().st_size for f in files)
            aux_mib = chunk * source.aux.shape[1] * source.aux.dtype.itemsize / 2**20
            row = {"chunk_tokens": chunk, "chunks_per_shard": per_shard, "files": len(files),
                   "chunk_mib_aux": aux_mib}  # fmt: skip
            row |= {"write_mb_per_s": raw / seconds / 1e6, "ratio": raw / stored}
            row |= random_reads(out, args.reads, seed=chunk)
            rows.append(row)
            shutil.rmtree(out)
            print(json.dumps(row), file=sys.stderr, flush=True)
    report = {
        "command": " ".join(["python", "bench/chunks.py", *sys.argv[1:]]),
        "store": {k: source.attrs.get(k) for k in ("model_id", "hidden_size", "num_taps", "num_tokens")},
        "samples": source.num_samples,
        "mean_sample_tokens": float(np.diff(source.sample_offsets).mean()),
        "rows": rows,
    }
    print(f"\n{report['command']}")
    head = ("chunk", 6), ("shard", 5), ("files", 6), ("MiB", 6), ("write MB/s", 10), ("ratio", 6)
    print(" ".join(f"{name:>{width}}" for name, width in head), f"{'read MB/s':>10} {'amplif.':>8}")
    for r in rows:
        print(
            f"{r['chunk_tokens']:>6} {r['chunks_per_shard']:>5} {r['files']:>6} {r['chunk_mib_aux']:>6.2f} "
            f"{r['write_mb_per_s']:>10.0f} {r['ratio']:>6.3f} {r['read_mb_per_s']:>10.0f} "
            f"{r['read_amplification']:>8.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
