"""The served rule's entry: every prompt set, drafter and k in one job, the target inside an SGLang engine
(`evaluate.served` runs the engines) -> `served.json`."""

from __future__ import annotations

import json
from pathlib import Path

from eyas.config import EvaluateSettings, SglangSettings
from eyas.core.acceptance import max_prompt_tokens
from eyas.evaluate.drafters import export_for_serving, load_drafters
from eyas.evaluate.served import SERVED_FORMAT
from eyas.evaluate.sets import load_prompt_set
from eyas.evaluate.stage_specdec import check_made_with, specdec_settings
from eyas.model.target import load_tokenizer


def run_served(
    *,
    set_paths: dict[str, str],
    set_formats: dict[str, str],
    drafter_dir: str,
    export_dir: str,
    model_dir: str,
    out_json: str,
    settings: EvaluateSettings,
    engine_settings: SglangSettings,
    baselines: list[dict] | None = None,
    trust_remote_code: bool = False,
    record: dict | None = None,
) -> dict:
    """Served evaluation (`evaluate.backend` sglang): every set, drafter and k in one job, the target
    in SGLang (`evaluate.served`); writes `out_json` atomically and returns its dict. `record` as
    `serve_drafters`'s."""
    import tempfile

    from eyas.engine.sglang_args import (
        SERVED_OWNED_ARGS,
        base_engine_args,
        installed_version,
        server_arg_names,
        user_engine_args,
    )
    from eyas.evaluate.served import serve_drafters, tau_by_origin, write_served

    drafters, _, identity = load_drafters(drafter_dir, model_dir, baselines, settings.untrained_control)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    config = drafters["trained"].config
    ks = list(settings.num_draft_tokens)
    max_prompt = max_prompt_tokens(config.max_position_embeddings, settings.max_new_tokens, ks)
    prompt_sets = {
        name: load_prompt_set(name, path, tokenizer, settings.num_prompts, max_prompt, set_formats.get(name))
        for name, path in set_paths.items()
    }
    for name, prompt_set in prompt_sets.items():
        if not prompt_set.prompts:
            raise ValueError(f"{set_paths[name]}: no {name} prompt fits (max {max_prompt} tokens)")
    base = base_engine_args(engine_settings, model_dir, "bfloat16", trust_remote_code)
    base |= user_engine_args(engine_settings.engine_args, server_arg_names(), SERVED_OWNED_ARGS)
    with tempfile.TemporaryDirectory(prefix="eyas-served-", dir=Path(out_json).parent) as workdir:
        exports = export_for_serving(drafters, export_dir, model_dir, workdir)
        served = serve_drafters(
            prompt_sets={name: s.prompts for name, s in prompt_sets.items()},
            drafter_exports=exports,
            base_args=base,
            ks=ks,
            max_new_tokens=settings.max_new_tokens,
            concurrency=settings.concurrency,
            record=record,
            stage=f"served evaluation {out_json}",
        )
    for set_name, by_drafter in served["sets"].items():
        origins = prompt_sets[set_name].origins
        for by_k in by_drafter.values():
            for report in by_k.values():
                report["tau_by_origin"] = tau_by_origin(report, origins)
    result = {
        "format": SERVED_FORMAT,
        "sglang_version": installed_version(),
        "engine_args": {k: v for k, v in base.items() if k != "model_path"},
        "settings": specdec_settings(settings)
        | {"num_draft_tokens": ks, "concurrency": settings.concurrency},
        "identity": identity,
        "meta": {name: s.meta() for name, s in prompt_sets.items()},
        **served,
    }
    write_served(out_json, result)
    return result


def read_served(path: str, settings: EvaluateSettings, identity: dict) -> dict:
    """`run_served`'s JSON, refused (naming the file and field) unless made with these drafters and
    these settings (the k list and concurrency included)."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != SERVED_FORMAT:
        raise ValueError(f"{path}: field 'format' is {data.get('format')!r}, expected {SERVED_FORMAT!r}")
    want_settings = specdec_settings(settings) | {
        "num_draft_tokens": list(settings.num_draft_tokens),
        "concurrency": settings.concurrency,
    }
    return check_made_with(path, data, identity=identity, settings=want_settings)
