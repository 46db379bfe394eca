"""Hidden stores on disk against the extraction pre-flight's estimate (eyas.store.size): bytes stored
per token of finished stores, and the estimate for the same token counts, shapes and storage.

    python bench/store_size.py results/hidden/*/shard-*.zarr --out bench/results/store-size-cpu-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import zarr

from eyas.extract.job import stored_bytes
from eyas.store.size import estimated_store_bytes


def measure(store: Path) -> dict:
    with warnings.catch_warnings():  # Snakemake's timestamp file beside the arrays
        warnings.simplefilter("ignore")
        attrs = dict(zarr.open_group(store, mode="r").attrs)
    tokens, hidden, groups = attrs["num_tokens"], attrs["hidden_size"], attrs["num_taps"] + 1
    stored = stored_bytes(store)
    estimate = estimated_store_bytes(
        tokens, hidden, groups, attrs["storage"], attrs.get("compression", "zstd")
    )
    return {
        "store": str(store),
        "storage": attrs["storage"],
        "model_id": attrs["model_id"],
        "tokens": tokens,
        "hidden_size": hidden,
        "groups": groups,
        "bytes_stored": stored,
        "bytes_per_token": stored / tokens,
        "fraction_of_raw_bf16": stored / (tokens * groups * hidden * 2),
        "estimate_bytes": estimate,
        "estimate_over_stored": estimate / stored,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [measure(s) for s in args.stores]
    for r in rows:
        print(
            f"{r['store']}: {r['tokens']:,} tok, {r['bytes_per_token']:.0f} B/tok stored "
            f"({r['fraction_of_raw_bf16']:.4f} of raw bf16), estimate {r['estimate_over_stored']:.3f}x stored"
        )
    if args.out:
        result = {"command": " ".join(["python", *sys.argv]), "cwd": str(Path.cwd()), "stores": rows}
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
