"""Loader read rate by read path and reader threads, on stores written with the extract codec
(`train.py`'s loader case, unpinned):

    .venv/bin/python bench/loader_paths.py --shape 8b --samples 24 --readers 1,2

Paths: `zarr`, zarr's own slicing (forced by making `eyas.store.direct_readable` answer False);
`direct-copy`, direct chunk reads (`eyas.store.chunk_rows`) into per-sample tensors then copied into the
batch (forced by making `HiddenStore.sample_into` take its copy path); `direct`, chunks decoded
straight into the batch (what the loader does). Each (path, readers) runs in a fresh interpreter.
Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def one_run(path: str, shape: str, samples: int, length: int, budget: int, readers: int) -> dict:
    import eyas.store as store

    sys.path.insert(0, str(HERE))
    import train

    if path == "zarr":
        store.direct_readable = lambda array: False
    if path in ("zarr", "direct-copy"):

        def copied(self, index, aux_out, final_out):
            aux, final = self.sample(index)
            aux_out.copy_(aux)
            final_out.copy_(final)

        store.HiddenStore.sample_into = copied
    result = train.case_loader(shape, samples, length, budget, readers, False)
    return {"path": path, "readers": readers, "tokens_per_s": result["tokens_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=["smollm2", "8b"])
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--budget", type=int, default=16384)
    ap.add_argument("--readers", default="1,2")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one run, in a child
    args = ap.parse_args()
    if args.one:
        path, readers = args.one.split(":")
        print(json.dumps(one_run(path, args.shape, args.samples, args.length, args.budget, int(readers))))
        return
    for path in ("zarr", "direct-copy", "direct"):
        for readers in args.readers.split(","):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--one", f"{path}:{readers}"]
            print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
