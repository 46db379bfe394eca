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
    exp = commands.add_parser(
        "export-specforge",
        help="write eyas stores as a SpecForge offline dump (rows_*/data_*.ckpt) for SpecForge's trainer",
    )
    exp.add_argument("stores", help="results root holding tokens/{split}/ and hidden/{split}/")
    exp.add_argument("out", help="output dir (replaced atomically): rows_*/data_*.ckpt + eyas-export.json")
    exp.add_argument("--split", default="train", choices=("train", "eval"))
    exp.add_argument("--file-group-size", type=int, default=2000, help="samples per rows_* folder")
    exp.add_argument(
        "--loss-mask",
        default="assistant",
        choices=("assistant", "eyas-targets"),
        help="assistant: eyas's mask as is (SpecForge's own convention); eyas-targets: shifted by two so "
        "SpecForge's loss positions equal eyas's (src/eyas/interop/specforge_export.py)",
    )
    prep = commands.add_parser(
        "specforge-prepare",
        help="write what SpecForge 0.2.0's own trainer needs to train on an export-specforge dump "
        "(draft config, vocab mapping, target head dir, run.yaml; src/eyas/interop/specforge_train.py)",
    )
    prep.add_argument("dump", help="the export-specforge dump (holds eyas-export.json)")
    prep.add_argument("out", help="output dir: draft_config.json, vocab_mapping.pt, target/, run.yaml")
    prep.add_argument("--model", required=True, help="the target's HF model dir")
    prep.add_argument("--vocab", required=True, help="eyas's draft vocab (draft_vocab.safetensors)")
    prep.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a SpecForge setting (eyas.interop.specforge_train.DEFAULT_SETTINGS), JSON or YAML; repeatable",
    )  # fmt: skip
    drafter = commands.add_parser(
        "import-specforge-drafter",
        help="convert a SpecForge 0.2.0 EAGLE-3 checkpoint into an eyas drafter dir (for evaluate.baselines)",
    )
    drafter.add_argument("checkpoint", help="training_state.pt, a *-stepN dir, or the run's output dir")
    drafter.add_argument("out", help="the eyas drafter dir to write")
    drafter.add_argument("--model", required=True, help="the target's HF model dir")
    drafter.add_argument("--vocab", required=True, help="the draft vocab the run was given")
    drafter.add_argument("--dump", required=True, help="the export-specforge dump it trained on (provenance)")
    args = parser.parse_args(argv)
    if args.command == "specforge-prepare":
        import yaml

        from eyas.interop.specforge_train import prepare_specforge_run

        settings = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error(f"--set {item!r} is not KEY=VALUE")
            try:  # JSON first: YAML 1.1 reads 1e-3 as a string
                settings[key] = json.loads(value)
            except json.JSONDecodeError:
                settings[key] = yaml.safe_load(value)
        info = prepare_specforge_run(args.dump, args.out, args.model, args.vocab, settings)
        json.dump({k: v for k, v in info.items() if k != "run"}, sys.stdout, indent=1)
        print()
        return 0
    if args.command == "import-specforge-drafter":
        from eyas.interop.specforge_train import import_specforge_drafter

        json.dump(
            import_specforge_drafter(args.checkpoint, args.out, args.model, args.vocab, args.dump),
            sys.stdout,
            indent=1,
        )
        print()
        return 0
    if args.command == "export-specforge":
        from eyas.interop.specforge_export import export_specforge

        manifest = export_specforge(
            args.stores, args.out, split=args.split, file_group_size=args.file_group_size,
            loss_mask=args.loss_mask,
        )  # fmt: skip
        summary = {key: manifest[key] for key in ("count", "tokens", "loss_mask", "split")}
        json.dump({**summary, "out": args.out}, sys.stdout, indent=1)
        print()
        return 0

    from eyas.interop.specforge_import import import_specforge

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
