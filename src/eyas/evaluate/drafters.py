"""The drafters an evaluation compares: the trained one, an untrained control of the same shape, and any
configured baselines (refused unless they come from the same target and tokenizer), plus their SGLang
exports for serving."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from eyas.core.provenance import DRAFTER_PROVENANCE, sha256_file
from eyas.model.drafter import Eagle3Drafter
from eyas.model.target import load_embed_and_head

UNTRAINED_SEED = 0


def untrained_like(drafter: Eagle3Drafter, model_dir: str | os.PathLike, seed: int = 0) -> Eagle3Drafter:
    """A freshly initialised drafter with the same config, target embedding and draft vocab."""
    torch.manual_seed(seed)
    baseline = Eagle3Drafter(drafter.config)
    embed, _ = load_embed_and_head(model_dir)
    baseline.set_target_embedding(embed)
    baseline.set_vocab(drafter.d2t.clone(), drafter.t2d.clone())
    return baseline.eval()


def _load_baseline(name: str, path: str, expected: dict) -> Eagle3Drafter:
    """A configured drafter dir; it must come from the same target and tokenizer as the trained one."""
    meta = json.loads((Path(path) / "config.json").read_text())
    for key, want in expected.items():
        if meta.get(key) != want:
            raise ValueError(
                f"evaluate.baselines {name!r} ({path}/config.json): provenance field {key!r} is "
                f"{meta.get(key)!r}, the trained drafter's is {want!r}"
            )
    return Eagle3Drafter.from_pretrained(path).eval()


def baseline_dirs(names: list[str], paths: list[str]) -> list[dict]:
    """`evaluate.baselines` as [{name, path}], from a rule's parallel lists of names and input dirs."""
    return [{"name": n, "path": p} for n, p in zip(names, paths, strict=True)]


def load_drafters(
    drafter_dir: str, model_dir: str, baselines: list[dict] | None, untrained_control: bool = True
) -> tuple[dict[str, Eagle3Drafter], dict, dict]:
    """{name: drafter} (trained, untrained, baselines in config order), the trained drafter's
    provenance (`DRAFTER_PROVENANCE` fields) and the identity a per-set JSON must match: provenance,
    the weights' sha256 of the trained drafter and of each baseline, the untrained drafter's seed.
    `untrained_control` False leaves the control out (a study comparing trained drafters only)."""
    drafter = Eagle3Drafter.from_pretrained(drafter_dir).eval()
    drafter_meta = json.loads((Path(drafter_dir) / "config.json").read_text())
    expected = {field: drafter_meta[field] for field in DRAFTER_PROVENANCE}
    drafters = {"trained": drafter}
    if untrained_control:
        drafters["untrained"] = untrained_like(drafter, model_dir, UNTRAINED_SEED)
    for item in baselines or []:
        drafters[item["name"]] = _load_baseline(item["name"], item["path"], expected)
    identity = {
        **{f"drafter_{k}": v for k, v in expected.items()},
        "drafter_sha256": sha256_file(Path(drafter_dir) / "model.safetensors"),
        "untrained_seed": UNTRAINED_SEED if untrained_control else None,
        "baselines_sha256": {
            item["name"]: sha256_file(Path(item["path"]) / "model.safetensors") for item in baselines or []
        },
    }
    return drafters, expected, identity


def export_for_serving(drafters: dict, trained_export: str, model_dir: str, workdir: str) -> dict[str, str]:
    """{name: SGLang export dir}: the export rule's output for the trained drafter, and an export made
    here, by the same exporter, for every other drafter (the untrained control, baselines)."""
    from eyas.core.layer_ids import text_model_type
    from eyas.export import export_sglang
    from eyas.model.target import read_config

    model_type = text_model_type(read_config(model_dir))
    exports = {"trained": os.fspath(trained_export)}
    for name, model in drafters.items():
        if name == "trained":
            continue
        source = Path(workdir) / f"{name}-drafter"
        model.save_pretrained(source)
        exports[name] = os.fspath(Path(workdir) / f"{name}-sglang")
        export_sglang(source, exports[name], model_type)
    for name, path in exports.items():
        check_export(path, drafters[name].config)
    return exports


def check_export(export_dir: str | os.PathLike, config) -> None:
    """An SGLang export dir holds exactly the tensors its drafter config needs (SGLang itself would
    skip a misnamed key and serve that weight at its initial value); raises naming file and key."""
    from safetensors.torch import load_file

    from eyas.export import validate_tensors

    path = Path(export_dir) / "model.safetensors"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the SGLang export has no weights (rerun rule export_sglang)")
    try:
        validate_tensors(load_file(path), config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
