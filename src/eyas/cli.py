"""`eyas` command line: tools outside the Snakemake workflow."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eyas", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser(
        "import-specforge",
        help="convert a SpecForge offline dump (rows_*/data_*.ckpt) into eyas token shards + hidden stores",
    )
    imp.add_argument("dump", help="the dump's root folder")
    imp.add_argument("out", help="output root: writes tokens/{split}/, hidden/{split}/, import/{split}/")
    imp.add_argument("--model", required=True, help="the target's HF model dir (provenance, tokenizer)")
    imp.add_argument("--model-id", default=None, help="name recorded in provenance (default: --model)")
    imp.add_argument("--split", default="train", choices=("train", "eval"))
    imp.add_argument("--samples-per-shard", type=int, default=4096)
    imp.add_argument(
        "--layer-ids", default=None, help="drafter tap ids, e.g. 1,15,28 (default [1, L//2-1, L-4])"
    )
    args = parser.parse_args(argv)

    from eyas.specforge_import import import_specforge

    layer_ids = [int(v) for v in args.layer_ids.split(",")] if args.layer_ids else None
    stats = import_specforge(
        args.dump,
        args.out,
        args.model,
        split=args.split,
        samples_per_shard=args.samples_per_shard,
        layer_ids=layer_ids,
        model_id=args.model_id,
    )
    json.dump(stats, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
