"""The evaluate rule's entry: offline metrics (simulated tau on the held-out stores) of every drafter, then
the per-set JSONs of the specdec jobs and/or the served JSON (each refused when made with other drafters
or settings, naming the file and the field) -> `summary.json` and the acceptance plot."""

from __future__ import annotations

import logging

import torch

from eyas.config import EvaluateSettings
from eyas.evaluate.drafters import load_drafters
from eyas.evaluate.served import specdec_view
from eyas.evaluate.stage_served import read_served
from eyas.evaluate.stage_specdec import DTYPE, read_specdec_set, specdec_settings
from eyas.evaluate.summary import write_summary
from eyas.model.target import resolve_device
from eyas.train.heldout import evaluate_offline

log = logging.getLogger("eyas.evaluate")


def run_evaluation(
    *,
    drafter_dir: str,
    specdec_paths: dict[str, str],
    token_shards: list[str],
    hidden_stores: list[str],
    model_dir: str,
    out_summary: str,
    out_plot: str,
    settings: EvaluateSettings,
    ttt_steps: int,
    baselines: list[dict] | None = None,
    threads: int | None = None,
    served_path: str | None = None,
) -> dict:
    """`specdec_paths` maps each evaluation set name (config order) to its `run_specdec_set` JSON (the
    HF backend; empty when only SGLang served); `served_path` is `run_served`'s JSON (the SGLang
    backend) or None; `baselines` are [{name, path}] drafter dirs beside the trained and untrained."""
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(settings.device)
    control = settings.untrained_control
    drafters, expected, identity = load_drafters(drafter_dir, model_dir, baselines, control)
    sets = {name: read_specdec_set(path, name, settings, identity) for name, path in specdec_paths.items()}
    served = read_served(served_path, settings, identity) if served_path else None
    if not sets:
        if served is None:
            raise ValueError("evaluate: neither an HF (specdec) nor a served result to merge")
        first_k = str(served["settings"]["num_draft_tokens"][0])
        sets = {
            name: {
                "device": "cuda",
                "meta": served["meta"][name],
                "reports": {d: specdec_view(by_k[first_k]) for d, by_k in drafters_.items()},
            }
            for name, drafters_ in served["sets"].items()
        }
    devices = {data["device"] for data in sets.values()}
    if len(devices) != 1:
        raise ValueError(
            f"{', '.join(specdec_paths.values())}: field 'device' differs between sets: {devices}"
        )

    offline = {}
    for name, model in drafters.items():
        offline[name] = evaluate_offline(
            model, token_shards, hidden_stores, model_dir,
            ttt_steps=ttt_steps, expected_provenance=expected, device=device,
        )  # fmt: skip
        log.info("offline %s: simulated tau %.3f", name, offline[name]["simulated_tau"])

    meta = {
        "drafter": drafter_dir,
        "model_dir": model_dir,
        "device": devices.pop(),  # of real decoding, whose speeds the summary reports
        "dtype": str(DTYPE).removeprefix("torch."),
        "temperature": specdec_settings(settings)["temperature"],
        "sets": {name: data["meta"] for name, data in sets.items()},
        "baselines": {item["name"]: item["path"] for item in baselines or []},
        **{f"drafter_{k}": v for k, v in expected.items()},
    }
    meta["backend"] = ("hf+sglang" if specdec_paths else "sglang") if served else "hf"
    specdec = {name: data["reports"] for name, data in sets.items()}
    return write_summary(out_summary, out_plot, offline=offline, specdec=specdec, meta=meta, served=served)
