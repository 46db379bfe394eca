"""An SGLang engine's start with every model module imported against only those its model needs.

    python bench/gpu/engine_start.py --config config/gpu-smollm2.yaml --model /root/smollm2 --out OUT \
        [--repeats N] [--no-engine]

`eyas.engine.sglang_models.only_needed_models` names in `SGLANG_DISABLED_MODEL_ARCHS` every module of
`sglang.srt.models` that registers none of the engine's architectures; `all` sets the variable empty,
the user's way to import every module (SGLang's own default). Per repeat and mode, in fresh processes:
`registry` times the import of SGLang's model registry after the scheduler module's own imports (what a
scheduler process does before it loads the model); `engine` times `eyas.engine.sglang.start_engine` with
the recipe's regeneration engine args (`regenerate.engine`, one engine at the config's memory
fraction, SGLang's log at info: its phases' times are in the child's log), up to ready, then shuts it
down. Writes OUT/engine_start.json with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
from gpubench import machine, run_child, run_or_child, write_json  # noqa: E402

from eyas.engine.sglang_models import SKIP_ENV  # noqa: E402  (imports no sglang)

MODES = ("all", "needed")


def child_registry(args) -> None:
    began = time.perf_counter()
    import sglang.srt.managers.scheduler  # noqa: F401  (the scheduler process's imports come first)

    from eyas.engine.sglang_models import only_needed_models

    scheduler_import = time.perf_counter() - began

    with only_needed_models([args.model]):
        began = time.perf_counter()
        from sglang.srt.models.registry import ModelRegistry

        seconds = time.perf_counter() - began
        skipped = len([m for m in os.environ.get(SKIP_ENV, "").split(",") if m])
    result = {"registry_import_seconds": seconds, "scheduler_import_seconds": scheduler_import,
              "architectures": len(ModelRegistry.models), "modules_skipped": skipped}  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


def child_engine(args) -> None:
    began = time.perf_counter()
    from eyas.engine.sglang import start_engine

    sys.path.insert(0, str(Path(__file__).parent))
    from generation import _engine_args, load_settings

    cfg, settings = load_settings(args.config, {"engines": 1})
    # SGLang's info log times the start's phases (weights, memory pool, graph capture) in the child's log
    engine_args = _engine_args(cfg, settings, args.model) | {"log_level": "info"}
    imported = time.perf_counter()
    engine = start_engine(engine_args, speculative=False, stage="engine start bench")
    started = time.perf_counter()
    engine.shutdown()
    result = {"engine_start_seconds": started - imported, "import_seconds": imported - began,
              "engine_args": engine_args}  # fmt: skip
    Path(args.result).write_text(json.dumps(result))


def summary(runs: list[dict], key: str) -> dict:
    by_mode = {m: [r[key] for r in runs if r["mode"] == m and key in r] for m in MODES}
    medians = {m: statistics.median(v) for m, v in by_mode.items() if v}
    out = {"seconds": by_mode, "median_seconds": medians}
    if len(medians) == 2 and medians["needed"] > 0:
        out["all_over_needed"] = medians["all"] / medians["needed"]
        out["saved_seconds"] = medians["all"] - medians["needed"]
    return out


def run(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["--config", args.config, "--model", args.model]
    kinds = ["_registry"] + ([] if args.no_engine else ["_engine"])
    runs = []
    for repeat in range(args.repeats):
        for mode in MODES:
            if mode == "all":
                os.environ[SKIP_ENV] = ""
            else:
                os.environ.pop(SKIP_ENV, None)
            for kind in kinds:
                result = args.out / f"{kind[1:]}-{mode}-{repeat}.json"
                child = [kind, *common, "--result", str(result)]
                log = args.out / f"{kind[1:]}-{mode}-{repeat}.log"
                runs.append(run_child(child, log, args.timeout) | {"mode": mode, "kind": kind[1:]})
    os.environ.pop(SKIP_ENV, None)
    report = {
        "machine": machine(),
        "runs": runs,
        "registry": summary([r for r in runs if r["kind"] == "registry"], "registry_import_seconds"),
    }
    if not args.no_engine:
        report["engine"] = summary([r for r in runs if r["kind"] == "engine"], "engine_start_seconds")
    write_json(args.out / "engine_start.json", report)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/gpu-smollm2.yaml")
    ap.add_argument("--model", help="the target's HF dir (the recipe's results/assets/model)")
    ap.add_argument("--out", type=Path, help="folder for engine_start.json and the children's logs")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each mode, alternating (default 1)")
    ap.add_argument("--no-engine", action="store_true", help="the registry import only")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per child run")
    children = {"_registry": child_registry, "_engine": child_engine}
    run_or_child(ap, argv, run, children, ("--result",), required=("model", "out"))


if __name__ == "__main__":
    main()
