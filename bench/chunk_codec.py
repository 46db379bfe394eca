"""What a hidden-store chunk's Blosc settings cost: its bytes, encode and decode time, one thread.

Every store chunk is encoded once (by extraction's writer threads, beside the engine) and decoded by
every reader: training's loader once an epoch, validation once. The stores use zstd level 1 with
bitshuffle for fp8 and byte shuffle for bf16 (`eyas.store.layout.BLOSC_SETTINGS`); this times those
against lighter settings on one chunk of the GPU recipe's shape (256 tokens, 3 taps of hidden 576):

    .venv/bin/python bench/chunk_codec.py --out OUT.json [--store RUN/results/hidden/train/shard-00000.zarr]

Without `--store` the chunk holds synthetic states (normal, per-token scale: their bytes compress
otherwise than real ones, so take the sizes from a real store); with it, the store's first aux chunk
as stored. `clevel` 0 is Blosc's copy: no compression, the same frame the readers already decode.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import numcodecs
import numpy as np
import torch

from eyas.store import HiddenStore
from eyas.store.quant import fp8_quantize

SETTINGS = [  # (cname, clevel, shuffle): the stores' own first
    ("zstd", 1, "bitshuffle"),
    ("zstd", 1, "noshuffle"),
    ("zstd", 1, "shuffle"),
    ("lz4", 1, "bitshuffle"),
    ("lz4", 1, "noshuffle"),
    ("lz4", 0, "noshuffle"),
]
SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def synthetic_chunk(tokens: int = 256, taps: int = 3, hidden: int = 576) -> np.ndarray:
    """[tokens, taps * hidden] e4m3 bits of normal states quantized per token, as extraction does."""
    states = torch.randn(tokens, taps, hidden, generator=torch.Generator().manual_seed(0)) * 2.0
    bits, _ = fp8_quantize(states)
    return np.ascontiguousarray(bits.reshape(tokens, taps * hidden).numpy())


def timed(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def case(chunk: np.ndarray, cname: str, clevel: int, shuffle: str, repeats: int) -> dict:
    codec = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=SHUFFLE[shuffle], blocksize=1 << 20)
    encoded = codec.encode(chunk)
    out = np.empty_like(chunk)
    decode = timed(lambda: codec.decode(encoded, out=out), repeats)
    encode = timed(lambda: codec.encode(chunk), repeats)
    assert np.array_equal(out, chunk)
    return {
        "cname": cname, "clevel": clevel, "shuffle": shuffle,
        "ratio": round(chunk.nbytes / len(encoded), 3),
        "decode_us": round(1e6 * decode, 1), "decode_gb_per_s": round(chunk.nbytes / decode / 1e9, 2),
        "encode_us": round(1e6 * encode, 1), "encode_gb_per_s": round(chunk.nbytes / encode / 1e9, 2),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--store", help="a hidden store: its first aux chunk instead of synthetic states")
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    numcodecs.blosc.set_nthreads(1)
    if args.store:
        store = HiddenStore(args.store)
        chunk = np.ascontiguousarray(store.stored_rows("aux", 0, store.aux.chunks[0]))
    else:
        chunk = synthetic_chunk()
    copy = np.empty_like(chunk)
    memcpy = timed(lambda: np.copyto(copy, chunk), args.repeats)
    cases = [case(chunk, *setting, args.repeats) for setting in SETTINGS]
    for row in cases:
        print(json.dumps(row), flush=True)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "what": "one hidden-store chunk under Blosc settings: ratio, encode and decode, one thread",
        "machine": platform.machine(),
        "chunk": {
            "source": args.store or "synthetic fp8 e4m3 (normal states)",
            "shape": list(chunk.shape),
            "dtype": str(chunk.dtype),
            "bytes": chunk.nbytes,
        },  # fmt: skip
        "memcpy_us": round(1e6 * memcpy, 1),
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
