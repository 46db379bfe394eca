"""The evaluate stage: the trained drafter, an untrained baseline and any configured baseline drafters,
offline (simulated tau on the held-out stores) and in real speculative decoding on each prompt set.

Two steps, so the prompt sets decode in parallel jobs (CPU decoding is memory-latency bound: two
1-thread processes decode more tokens/s together than one 2-thread process):
- `run_specdec_set`: one prompt set, every drafter -> one JSON (format `SPECDEC_SET_FORMAT`) holding
  the set's meta, each drafter's report, and the identity of the drafters and settings it used;
- `run_evaluation`: offline metrics per drafter, then the per-set JSONs (refused when made with other
  drafters or settings, naming the file and the field) -> `summary.json` and the acceptance plot.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from eyas.atomic import atomic_file
from eyas.config import EvaluateSettings
from eyas.evaluate.served import SERVED_FORMAT, specdec_view
from eyas.evaluate.sets import load_prompt_set
from eyas.evaluate.specdec import evaluate_specdec
from eyas.evaluate.summary import json_safe, write_summary
from eyas.model.drafter import Eagle3Drafter
from eyas.provenance import DRAFTER_PROVENANCE, sha256_file
from eyas.target import load_embed_and_head, load_target, load_tokenizer, resolve_device
from eyas.train.heldout import evaluate_offline

log = logging.getLogger("eyas.evaluate")

SPECDEC_SET_FORMAT = "eyas.specdec_set/1"
# fp32 everywhere: bf16 rounding differs between 1-token and k-token forwards, so greedy equality
# (the correctness check of speculative decoding) only holds in fp32 (measured on the H200).
DTYPE = torch.float32
UNTRAINED_SEED = 0
# The settings a per-set JSON must share with the merge (the rest of `settings` is device placement).
SPECDEC_SETTINGS = ("num_prompts", "max_new_tokens", "num_draft_tokens", "temperature", "seed")


def specdec_settings(settings: EvaluateSettings) -> dict:
    """The `SPECDEC_SETTINGS` of the `evaluate` section, as a per-set JSON records them: the HF loop
    decodes the first k of the sweep."""
    chosen = {key: getattr(settings, key) for key in SPECDEC_SETTINGS}
    return chosen | {"num_draft_tokens": settings.num_draft_tokens[0]}


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
    drafter_dir: str, model_dir: str, baselines: list[dict] | None
) -> tuple[dict[str, Eagle3Drafter], dict, dict]:
    """{name: drafter} (trained, untrained, baselines in config order), the trained drafter's
    provenance (`DRAFTER_PROVENANCE` fields) and the identity a per-set JSON must match: provenance,
    the weights' sha256 of the trained drafter and of each baseline, the untrained drafter's seed."""
    drafter = Eagle3Drafter.from_pretrained(drafter_dir).eval()
    drafter_meta = json.loads((Path(drafter_dir) / "config.json").read_text())
    expected = {field: drafter_meta[field] for field in DRAFTER_PROVENANCE}
    drafters = {"trained": drafter, "untrained": untrained_like(drafter, model_dir, UNTRAINED_SEED)}
    for item in baselines or []:
        drafters[item["name"]] = _load_baseline(item["name"], item["path"], expected)
    identity = {
        **{f"drafter_{k}": v for k, v in expected.items()},
        "drafter_sha256": sha256_file(Path(drafter_dir) / "model.safetensors"),
        "untrained_seed": UNTRAINED_SEED,
        "baselines_sha256": {
            item["name"]: sha256_file(Path(item["path"]) / "model.safetensors") for item in baselines or []
        },
    }
    return drafters, expected, identity


def run_specdec_set(
    *,
    set_name: str,
    set_path: str,
    drafter_dir: str,
    set_format: str | None = None,
    model_dir: str,
    out_json: str,
    settings: EvaluateSettings,
    baselines: list[dict] | None = None,
    threads: int | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """Real speculative decoding of every drafter on one prompt set (plain greedy decoded once, shared
    by all drafters); writes `out_json` atomically and returns its dict."""
    if threads:
        torch.set_num_threads(threads)
    device = resolve_device(settings.device)
    chosen = specdec_settings(settings)
    drafters, _, identity = load_drafters(drafter_dir, model_dir, baselines)
    config = drafters["trained"].config
    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    max_prompt = config.max_position_embeddings - chosen["max_new_tokens"] - 2 * chosen["num_draft_tokens"]
    prompt_set = load_prompt_set(set_name, set_path, tokenizer, chosen["num_prompts"], max_prompt, set_format)
    if not prompt_set.prompts:
        raise ValueError(f"{set_path}: no {set_name} prompt fits (max {max_prompt} tokens)")
    decode = dict(
        max_new_tokens=chosen["max_new_tokens"],
        num_draft_tokens=chosen["num_draft_tokens"],
        eos_token_ids={tokenizer.eos_token_id},
        aux_layer_ids=config.aux_layer_ids,
        device=device,
        dtype=DTYPE,
        temperature=chosen["temperature"],
        seed=chosen["seed"],
    )
    reports = {}
    greedy_cache: dict = {}  # the set's plain greedy outputs: decoded once, not once per drafter
    target = load_target(model_dir, dtype=DTYPE, device=device)  # loaded once, shared by the drafters
    for name, model in drafters.items():
        reports[name] = evaluate_specdec(
            model_dir, model, prompt_set.prompts, **decode, greedy_cache=greedy_cache, target=target
        )
        log.info(
            "%s / %s: tau %.3f, speedup %s", set_name, name, reports[name]["tau"], reports[name]["speedup"]
        )
    result = {
        "format": SPECDEC_SET_FORMAT,
        "set": set_name,
        "meta": prompt_set.meta(),
        "device": device,
        "dtype": str(DTYPE).removeprefix("torch."),
        "settings": chosen,
        "identity": identity,
        "reports": json_safe(reports),
    }
    with atomic_file(out_json) as fh:
        fh.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
    return result


def export_for_serving(drafters: dict, trained_export: str, model_dir: str, workdir: str) -> dict[str, str]:
    """{name: SGLang export dir}: the export rule's output for the trained drafter, and an export made
    here, by the same exporter, for every other drafter (the untrained control, baselines)."""
    from eyas.export import export_sglang
    from eyas.layer_ids import text_model_type
    from eyas.target import read_config

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


def run_served(
    *,
    set_paths: dict[str, str],
    set_formats: dict[str, str],
    drafter_dir: str,
    export_dir: str,
    model_dir: str,
    out_json: str,
    settings,
    engine_settings,
    baselines: list[dict] | None = None,
    trust_remote_code: bool = False,
    record: dict | None = None,
) -> dict:
    """Served evaluation (`evaluate.backend` sglang): every set, drafter and k in one job, the target
    in SGLang (`evaluate.served`); writes `out_json` atomically and returns its dict. `record` as
    `serve_drafters`'s."""
    import tempfile

    import sglang

    from eyas.evaluate.served import serve_drafters, write_served
    from eyas.sglang_engine import SERVED_OWNED_ARGS, base_engine_args, server_arg_names, user_engine_args

    drafters, _, identity = load_drafters(drafter_dir, model_dir, baselines)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    config = drafters["trained"].config
    ks = list(settings.num_draft_tokens)
    max_prompt = config.max_position_embeddings - settings.max_new_tokens - 2 * max(ks) - 2
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
    result = {
        "format": SERVED_FORMAT,
        "sglang_version": sglang.__version__,
        "engine_args": {k: v for k, v in base.items() if k != "model_path"},
        "settings": specdec_settings(settings)
        | {"num_draft_tokens": ks, "concurrency": settings.concurrency},
        "identity": identity,
        "meta": {name: s.meta() for name, s in prompt_sets.items()},
        **served,
    }
    write_served(out_json, result)
    return result


def read_specdec_set(path: str, set_name: str, settings: EvaluateSettings, identity: dict) -> dict:
    """A per-set JSON, refused (naming the file and the field) unless it was made for `set_name` with
    these drafters (`identity` of `load_drafters`) and these settings."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != SPECDEC_SET_FORMAT:
        raise ValueError(f"{path}: field 'format' is {data.get('format')!r}, expected {SPECDEC_SET_FORMAT!r}")
    if data.get("set") != set_name:
        raise ValueError(f"{path}: field 'set' is {data.get('set')!r}, expected {set_name!r}")
    return _check_made_with(path, data, identity=identity, settings=specdec_settings(settings))


def _check_made_with(path: str, data: dict, **sections: dict) -> dict:
    """`data` (a stage's JSON at `path`), refused naming the file and field unless each of its
    `sections` holds the wanted values (the drafters' identity, the settings it was made with)."""
    for section, want in sections.items():
        have = data.get(section) or {}
        for key, value in want.items():
            if have.get(key) != value:
                raise ValueError(
                    f"{path}: field '{section}.{key}' is {have.get(key)!r}, the current drafters and "
                    f"config give {value!r}: it was made with another drafter or settings; rerun its job"
                )
    return data


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
    drafters, expected, identity = load_drafters(drafter_dir, model_dir, baselines)
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
    return _check_made_with(path, data, identity=identity, settings=want_settings)
