"""The training loader's feed rate by store storage: bf16 against fp8 e4m3 stores of the GPU recipe's shape.

    .venv/bin/python bench/loader_storage.py --out OUT.json [--tokens 600000] [--readers 1 2] [--pin] \
        [--chunks-per-shard 1 16] [--compression zstd none]

Writes one store of each storage (SmolLM2's hidden 576, 3 taps and the final state, chat-like sample
lengths, random states at realistic magnitudes) in a temporary folder, then reads an epoch of 16,384-token
batches through `eyas.train.loader.PairedLoader` with each reader count, twice (the first pass also warms
the page cache; both are reported). What a batch holds is the loader's business (since fp8 stores hand
over their bits and scales, dequantized on the device, `Batch.to`); to compare that against the host's
dequantization, run it with each commit's `src` on PYTHONPATH on one machine, one after the other (its
JSON names the eyas it imported and that checkout's commit). `--chunks-per-shard` writes each store
once per value (`extract.chunks_per_shard`: 1 is one file a chunk; more, zarr v3 shards), and
`--compression` once per `extract.compression` (`none`: Blosc's uncompressed frames).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from train import bench_token_shard

from eyas.store import COMPRESSIONS, bf16_to_uint16, hidden_store_writer
from eyas.store.quant import fp8_quantize
from eyas.train.loader import PairedLoader

HIDDEN, TAPS = 576, 3  # SmolLM2-135M: hidden 576, EAGLE-3's 3 taps


def write_pair(
    root: Path, storage: str, tokens: int, seed: int = 0, chunks_per_shard: int = 1, compression: str = "zstd"
) -> tuple[str, str]:
    """A token shard and a hidden store of `storage` holding ~`tokens` tokens."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < tokens:  # chat-like: mean ~330, a long tail
        lengths.append(int(np.clip(rng.lognormal(5.5, 0.8), 16, 2048)))
    tok, hid = (
        root / f"tok-{storage}-{chunks_per_shard}-{compression}.zarr",
        root / f"hid-{storage}-{chunks_per_shard}-{compression}.zarr",
    )
    shard, attrs = bench_token_shard(tok, lengths, 49152, rng, [1, 14, 26])
    gen = torch.Generator().manual_seed(seed)
    with hidden_store_writer(
        hid,
        shard.sample_offsets,
        HIDDEN,
        TAPS,
        attrs,
        storage=storage,
        chunks_per_shard=chunks_per_shard,
        compression=compression,
    ) as writer:
        for s, n in enumerate(lengths):
            states = torch.randn(n, TAPS + 1, HIDDEN, generator=gen) * 2.0  # [T, K+1, H]
            if storage == "bf16":
                aux = bf16_to_uint16(states[:, :TAPS].reshape(n, TAPS * HIDDEN))
                writer.write_sample(s, aux, bf16_to_uint16(states[:, TAPS]))
            else:
                bits, scale = fp8_quantize(states)
                aux = bits[:, :TAPS].reshape(n, TAPS * HIDDEN).numpy()
                writer.write_sample(s, aux, bits[:, TAPS].numpy(), scale.numpy())
    return str(tok), str(hid)


def feed_rate(tok: str, hid: str, readers: int, pin: bool, budget: int) -> dict:
    loader = PairedLoader([tok], [hid], budget, 0, {"model_hash": "m"}, pin_memory=pin, readers=readers)
    plan = loader.plan(0)
    passes = []
    for _ in range(2):
        start = time.perf_counter()
        tokens = 0
        for batch in loader.batches(plan):
            tokens += batch.num_tokens
            dtype = str(batch.aux.dtype).removeprefix("torch.")
        seconds = time.perf_counter() - start
        rate = round(tokens / seconds)
        passes.append({"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": rate})
    return {"readers": readers, "batches": len(plan), "batch_dtype": dtype, "passes": passes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokens", type=int, default=600_000, help="tokens in each store")
    ap.add_argument("--readers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--budget", type=int, default=16384, help="train.token_budget")
    ap.add_argument("--pin", action="store_true", help="pinned batches, as the trainer asks on a GPU")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--chunks-per-shard", type=int, nargs="+", default=[1], help="store layouts to read")
    ap.add_argument("--compression", nargs="+", default=["zstd"], choices=COMPRESSIONS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import eyas

    source = Path(eyas.__file__).parent  # the eyas this ran (PYTHONPATH may name another checkout's src)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=source
    ).stdout.strip()
    cases = []
    with tempfile.TemporaryDirectory(prefix="eyas-loader-") as tmp:
        for storage in ("bf16", "fp8_e4m3"):
            for per_shard, compression in itertools.product(args.chunks_per_shard, args.compression):
                tok, hid = write_pair(Path(tmp), storage, args.tokens, 0, per_shard, compression)
                for readers in args.readers:
                    rate = feed_rate(tok, hid, readers, args.pin, args.budget)
                    cases.append(
                        {
                            "storage": storage,
                            "chunks_per_shard": per_shard,
                            "compression": compression,
                            **rate,
                        }
                    )
                    print(json.dumps(cases[-1]), flush=True)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "eyas": {"source": str(source), "commit": commit},
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "torch": torch.__version__,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
