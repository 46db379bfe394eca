"""How long the trainer waits for its reader processes' first batch (`train.loader_processes`).

The GPU recipe's trainings each waited 19-20 s for their first batch from 4 reader processes, at 100,
50 and 25% of a 6.0M-token run and in the same process one after another
(bench/results/recipe-h100-smollm2-6m-e3.json). The readers come from a forkserver. CPython's (3.11
to 3.13) never preloads `__main__`, its documented default: `ForkServer.ensure_running` keeps the keys
`main_path` and `sys_path` of the preparation data, which names the main script `init_main_from_path`.
So each reader re-ran the main script's imports (torch's among them), and `Process.start` waited on
each in turn. `eyas.train.loader` now has the server preload the loader's own module.

This times a fresh process's first batch (the forkserver's start included) and then two more passes
with new workers (the server up, as for a sweep's later trainings), for the loader as it is
(`preload`) and with the forkserver's default (`default`), each in a process of its own:

    .venv/bin/python bench/loader_start.py --out OUT.json [--tokens 6000000] [--readers 1 2 4]

The store is synthetic: the token shard at the size given (what a worker is sent), hidden states 8
wide (what a reader reads for a first batch does not set the start).
"""

from __future__ import annotations

import argparse
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

from eyas.core.atomic import atomic_file
from eyas.core.layer_ids import LAYER_ID_CONVENTION
from eyas.core.provenance import sha256_array
from eyas.store import hidden_store_writer, read_token_shard, write_token_shard

EXPECTED = {"model_hash": "bench", "layer_ids": [1, 14, 26], "model_id": "bench", "tokenizer_hash": "tok"}
WIDTH = 8


def write_pair(root: Path, tokens: int) -> tuple[str, str]:
    """A token shard of ~`tokens` chat-like samples and a narrow hidden store beside it."""
    rng = np.random.default_rng(0)
    samples, total = [], 0
    while total < tokens:
        n = int(np.clip(rng.lognormal(5.5, 0.8), 16, 2048))
        mask = np.r_[np.zeros(8), np.ones(n - 8)].astype(np.uint8)
        samples.append((rng.integers(0, 49152, n).astype(np.int32), mask))
        total += n
    prov = {"model_id": "bench", "tokenizer_hash": "tok", "chat_template_hash": "tpl"}
    tok, hid = root / "tok.zarr", root / "hid.zarr"
    write_token_shard(tok, samples, [f"c{i}:0" for i in range(len(samples))], prov)
    shard = read_token_shard(tok)
    attrs = {
        **prov,
        "model_hash": "bench",
        "layer_ids": EXPECTED["layer_ids"],
        "layer_id_convention": LAYER_ID_CONVENTION,
        "tokens_checksum": sha256_array(shard.input_ids),
    }
    with hidden_store_writer(hid, shard.sample_offsets, WIDTH, 3, attrs) as writer:
        for s, (ids, _) in enumerate(samples):
            zeros = np.zeros((len(ids), 4 * WIDTH), np.uint16)  # bf16 bits: [T, 3W] aux, [T, W] final
            writer.write_sample(s, zeros[:, : 3 * WIDTH], zeros[:, 3 * WIDTH :])
    return str(tok), str(hid)


def passes(tok: str, hid: str, readers: int, variant: str, count: int = 3) -> list[float]:
    """Seconds to the first batch of `count` passes, each with new workers (in this process)."""
    import multiprocessing

    import eyas.train.loader as loader_module

    if variant == "default":  # the forkserver as CPython sets it up: preload ['__main__'], not honoured
        loader_module._forkserver = lambda: multiprocessing.get_context("forkserver")
    loader = loader_module.PairedLoader([tok], [hid], 16384, 0, EXPECTED, readers=readers, processes=True)
    seconds = []
    for _ in range(count):
        began = time.perf_counter()
        next(iter(loader.epoch(0)))
        seconds.append(round(time.perf_counter() - began, 3))
        loader.close()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tokens", type=int, default=6_000_000)
    ap.add_argument("--readers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--child", nargs=4, metavar=("TOK", "HID", "READERS", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        tok, hid, readers, variant = args.child
        print(json.dumps(passes(tok, hid, int(readers), variant)))
        return
    if args.out is None:
        ap.error("--out is required")
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        tok, hid = write_pair(Path(tmp), args.tokens)
        for readers in args.readers:
            for variant in ("default", "preload"):
                child = [sys.executable, __file__, "--child", tok, hid, str(readers), variant]
                out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
                seconds = json.loads(out.strip().splitlines()[-1])
                cases.append({"readers": readers, "variant": variant, "first_batch_seconds": seconds})
                print(json.dumps(cases[-1]), flush=True)
    by = {(c["readers"], c["variant"]): c["first_batch_seconds"] for c in cases}
    ratios = {}
    for r in args.readers:
        default, preload = by[r, "default"], by[r, "preload"]
        ratios[str(r)] = {
            "first_pass_default_over_preload": round(default[0] / preload[0], 2),
            "later_passes_default_over_preload": round(sum(default[1:]) / sum(preload[1:]), 2),
        }
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "tokens": args.tokens,
        "cases": cases,
        "ratios": ratios,
    }
    with atomic_file(args.out) as fh:
        fh.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
