"""Settings sweep and data curve of a recipe, from finished runs' stores, judged by the served tau.

    python3 bench/studies/recipe_sweep.py --plan bench/studies/recipe_curve.json --model /root/smollm2 \
        --out OUT/recipe-sweep.json [--no-served]

The plan (JSON) names the config files of the recipe, the held-out prompt file, the served settings and
the variants. A variant either takes a drafter a pipeline already trained (`"drafter": DIR`, its train
time read from the run's `benchmarks/train.tsv`) or trains one here from a run's stores
(`"run": RESULTS_DIR`, the recipe's `train` settings with the variant's `"train"` overrides). Every
drafter is then served by the served evaluation of `rule served` (one SGLang engine, the drafters
swapped into its draft model, each k pinned; drafters of another shape, e.g. a wider MLP, in an
engine of their own) on the same held-out prompts. Written per variant:
its settings, training seconds on this device, tokens, steps, the best held-out simulated tau of
training, the served tau at each k and tau per device-minute of training (GPU recipe table of
bench/README.md).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch
import yaml

from eyas.config import TrainSettings, load_config
from eyas.core.atomic import atomic_file
from eyas.core.logs import setup_stage_logging
from eyas.store import read_token_shard, shard_paths
from eyas.train.job import train_inputs as job_inputs


def merged_config(paths: list[str]):
    """The recipe's Config: config files applied in order, nested keys merged."""

    def merge(base: dict, over: dict) -> dict:
        out = dict(base)
        for key, value in over.items():
            nested = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merge(out[key], value) if nested else value
        return out

    values: dict = {}
    for path in paths:
        values = merge(values, yaml.safe_load(Path(path).read_text()))
    return load_config(values)


def train_inputs(run: Path, model_dir: str, out: Path) -> dict:
    """`trainer.train`'s inputs for a run's results dir (`eyas.train.job.train_inputs`, as the rule's)."""
    tokens = run / "tokens" / "train"
    token_shards, stores = shard_paths(tokens), shard_paths(run / "hidden" / "train")
    if not token_shards or not stores:
        raise FileNotFoundError(f"{run}: no token shards or stores of the train split (a run's results dir?)")
    return job_inputs(
        tokens_dir=str(tokens),
        hidden_stores=stores,
        manifests=[s.removesuffix(".zarr") + ".manifest.json" for s in stores],
        vocab_path=str(run / "vocab" / "draft_vocab.safetensors"),
        model_dir=model_dir,
        model_id=read_token_shard(token_shards[0]).attrs["model_id"],
        out_dir=str(out / "drafter"),
        log_path=str(out / "log.csv"),
        heldout=(
            str(run / "tokens" / "eval"),
            shard_paths(run / "hidden" / "eval"),
        ),
        threads=len(os.sched_getaffinity(0)),  # every core this process may use
    )


def best_epoch(epochs_csv: Path) -> dict:
    """Held-out simulated tau, step-0 accuracy and walked tau (by chain length k) of every epoch; the
    best simulated tau (the epoch training keeps) and that epoch's walked tau by k."""
    with open(epochs_csv) as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("simulated_tau")]
    taus = [float(r["simulated_tau"]) for r in rows]
    walked = [[float(v) for c, v in r.items() if c.startswith("walked_tau_k") and v] for r in rows]
    best = taus.index(max(taus)) if taus else None
    return {
        "sim_tau_by_epoch": taus,
        "acc0_by_epoch": [float(r["acc_0"]) for r in rows],
        "walked_tau_by_k_by_epoch": walked,
        "best_sim_tau": taus[best] if taus else None,
        "best_walked_tau_by_k": walked[best] if taus else None,
    }


def train_variant(variant: dict, base: TrainSettings, model_dir: str, workdir: Path) -> dict:
    """Train one variant here (timed on this device); returns its drafter dir and figures."""
    from eyas.train.trainer import train

    settings = dataclasses.replace(base, **variant.get("train", {}))
    out = workdir / variant["name"]
    out.mkdir(parents=True, exist_ok=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    stats = train(settings, **train_inputs(Path(variant["run"]), model_dir, out))
    seconds = time.perf_counter() - start
    return {
        "drafter": str(out / "drafter"),
        "run": variant["run"],
        "train": dataclasses.asdict(settings),
        "train_seconds": seconds,
        "stats": stats,
        **best_epoch(out / "epochs.csv"),
    }


def pipeline_variant(variant: dict) -> dict:
    """A drafter the pipeline trained: its settings and time from the run's own files."""
    drafter = Path(variant["drafter"])
    config = json.loads((drafter / "config.json").read_text())
    results = drafter.parents[1]
    with open(results / "benchmarks" / "train.tsv") as fh:
        seconds = float(next(csv.DictReader(fh, delimiter="\t"))["s"])
    return {
        "drafter": str(drafter),
        "train": config.get("train_settings"),
        "train_seconds": seconds,
        "stats": config.get("train_stats"),
        **best_epoch(results / "train" / "epochs.csv"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--model", required=True, help="the target's HF dir")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/eyas-sweep"))
    parser.add_argument("--no-served", action="store_true", help="train only (CPU smoke runs)")
    args = parser.parse_args()
    # eyas's records on stderr: each epoch's pace (tok/s, seconds waited for the loader's batches)
    setup_stage_logging(None, "recipe_sweep")
    plan = json.loads(args.plan.read_text())
    config = merged_config(plan["configs"])
    base = dataclasses.replace(config.train, progress=False, checkpoint_every=0)
    results: dict = {}
    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor(),
        "torch": torch.__version__,
        "plan": plan,
        "status": "training",
        "variants": results,
        "failed": {},
        "served": None,
    }
    for variant in plan["variants"]:
        name = variant["name"]
        try:
            if "drafter" in variant:
                results[name] = pipeline_variant(variant)
            else:
                results[name] = train_variant(variant, base, args.model, args.workdir)
        except Exception as err:  # one variant that cannot train (e.g. a setting new to this device)
            traceback.print_exc()  # must not cost the others their serving: it is reported, not served
            report["failed"][name] = f"{type(err).__name__}: {err}"
            write_report(args.out, report)
            continue
        figures = results[name]
        print(name, figures["train_seconds"], figures["best_sim_tau"], flush=True)
        write_report(args.out, report)  # what is done so far survives a device budget that ends
    if results and not args.no_served:
        report["status"] = "serving"
        write_report(args.out, report)
        served = serve(plan, config, results, args.model, args.workdir)
        report["served"] = served
        first = next(iter(results))  # served as `trained`, the others as baselines by name
        for name, figures in results.items():
            by_k = served["sets"]["heldout"][name if name != first else "trained"]
            figures["served_tau"] = {k: r["tau"] for k, r in by_k.items()}
            minutes = figures["train_seconds"] / 60
            figures["tau_per_train_minute"] = {k: (t - 1) / minutes for k, t in figures["served_tau"].items()}
        write_report(args.out, report)
    report["status"] = "done"  # `failed` names any variant that did not train
    write_report(args.out, report)


def write_report(path: Path, report: dict) -> None:
    with atomic_file(path) as fh:  # creates the parent dir
        fh.write(json.dumps(report, indent=2) + "\n")


def serve(plan: dict, config, results: dict, model_dir: str, workdir: Path) -> dict:
    """One served evaluation of every variant's drafter (the first is `trained`, the rest baselines)."""
    from eyas.core.layer_ids import text_model_type
    from eyas.evaluate.stage_served import run_served
    from eyas.export import export_sglang
    from eyas.model.target import read_config

    names = list(results)
    first = results[names[0]]["drafter"]
    export = workdir / "first-sglang"
    export_sglang(first, export, text_model_type(read_config(model_dir)))
    # no untrained control unless the plan asks: it served 1.000 in both 2026-12-07 recipe runs and
    # cost ~60-70 s (bench/results/recipe-h100-smollm2-6m-e6.json); a plan's `evaluate` may turn it on
    evaluate = {"untrained_control": False} | plan.get("evaluate", {})
    settings = dataclasses.replace(config.evaluate, **evaluate)
    return run_served(
        set_paths={"heldout": plan["heldout"]},
        set_formats={},
        drafter_dir=first,
        export_dir=str(export),
        model_dir=model_dir,
        out_json=str(workdir / "served.json"),
        settings=settings,
        engine_settings=config.sglang,
        baselines=[{"name": n, "path": results[n]["drafter"]} for n in names[1:]],
    )


if __name__ == "__main__":
    main()
