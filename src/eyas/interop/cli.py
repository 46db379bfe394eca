"""`eyas` command line: tools outside the Snakemake workflow.

Each subcommand is a pair: `_<name>_arguments` declares its arguments, `_<name>` runs it and returns
the summary `main` prints as JSON."""

from __future__ import annotations

import argparse
import json
import sys


def _import_specforge_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("dump", help="the dump's root folder")
    command.add_argument("out", help="output root: writes tokens/{split}/, hidden/{split}/, import/{split}/")
    command.add_argument("--model", required=True, help="the target's HF model dir (provenance, tokenizer)")
    command.add_argument("--model-id", default=None, help="name recorded in provenance (default: --model)")
    command.add_argument("--split", default="train", choices=("train", "eval"))
    command.add_argument("--samples-per-shard", type=int, default=4096)
    command.add_argument(
        "--layer-ids", default=None, help="drafter tap ids, e.g. 1,15,28 (default [1, L//2-1, L-4])"
    )


def _import_specforge(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    from eyas.interop.specforge_import import import_specforge

    layer_ids = [int(v) for v in args.layer_ids.split(",")] if args.layer_ids else None
    return import_specforge(
        args.dump,
        args.out,
        args.model,
        split=args.split,
        samples_per_shard=args.samples_per_shard,
        layer_ids=layer_ids,
        model_id=args.model_id,
    )


def _export_specforge_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("stores", help="results root holding tokens/{split}/ and hidden/{split}/")
    command.add_argument(
        "out", help="output dir (replaced atomically): rows_*/data_*.ckpt + eyas-export.json"
    )
    command.add_argument("--split", default="train", choices=("train", "eval"))
    command.add_argument("--file-group-size", type=int, default=2000, help="samples per rows_* folder")
    command.add_argument(
        "--loss-mask",
        default="assistant",
        choices=("assistant", "eyas-targets"),
        help="assistant: eyas's mask as is (SpecForge's own convention); eyas-targets: shifted by two so "
        "SpecForge's loss positions equal eyas's (src/eyas/interop/specforge_export.py)",
    )


def _export_specforge(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    from eyas.interop.specforge_export import export_specforge

    manifest = export_specforge(
        args.stores, args.out, split=args.split, file_group_size=args.file_group_size,
        loss_mask=args.loss_mask,
    )  # fmt: skip
    summary = {key: manifest[key] for key in ("count", "tokens", "loss_mask", "split")}
    return {**summary, "out": args.out}


def _specforge_prepare_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("dump", help="the export-specforge dump (holds eyas-export.json)")
    command.add_argument("out", help="output dir: draft_config.json, vocab_mapping.pt, target/, run.yaml")
    command.add_argument("--model", required=True, help="the target's HF model dir")
    command.add_argument("--vocab", required=True, help="eyas's draft vocab (draft_vocab.safetensors)")
    command.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a SpecForge setting (eyas.interop.specforge_train.DEFAULT_SETTINGS), JSON or YAML; repeatable",
    )  # fmt: skip


def _specforge_prepare(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
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
    return {k: v for k, v in info.items() if k != "run"}


def _import_specforge_drafter_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("checkpoint", help="training_state.pt, a *-stepN dir, or the run's output dir")
    command.add_argument("out", help="the eyas drafter dir to write")
    command.add_argument("--model", required=True, help="the target's HF model dir")
    command.add_argument("--vocab", required=True, help="the draft vocab the run was given")
    command.add_argument("--dump", required=True, help="the export-specforge dump it trained on (provenance)")


def _import_specforge_drafter(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    from eyas.interop.specforge_train import import_specforge_drafter

    return import_specforge_drafter(args.checkpoint, args.out, args.model, args.vocab, args.dump)


COMMANDS = {  # name -> (help, declare its arguments, run it); `eyas --help` lists them in this order
    "import-specforge": (
        "convert a SpecForge offline dump (rows_*/data_*.ckpt) into eyas token shards + hidden stores",
        _import_specforge_arguments,
        _import_specforge,
    ),
    "export-specforge": (
        "write eyas stores as a SpecForge offline dump (rows_*/data_*.ckpt) for SpecForge's trainer",
        _export_specforge_arguments,
        _export_specforge,
    ),
    "specforge-prepare": (
        "write what SpecForge 0.2.0's own trainer needs to train on an export-specforge dump "
        "(draft config, vocab mapping, target head dir, run.yaml; src/eyas/interop/specforge_train.py)",
        _specforge_prepare_arguments,
        _specforge_prepare,
    ),
    "import-specforge-drafter": (
        "convert a SpecForge 0.2.0 EAGLE-3 checkpoint into an eyas drafter dir (for evaluate.baselines)",
        _import_specforge_drafter_arguments,
        _import_specforge_drafter,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eyas", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, declare_arguments, _) in COMMANDS.items():
        declare_arguments(commands.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    run = COMMANDS[args.command][2]
    json.dump(run(args, parser), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
