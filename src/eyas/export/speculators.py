"""Export a trained drafter as a vLLM speculators `Eagle3Speculator` dir.

The export carries `embed_tokens.weight` (speculators 0.9.0 leaves a missing one at zeros without a
warning) and names a verifier that resolves (`check_verifier`, key `export.verifier`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from safetensors.torch import save_file

from eyas.core.atomic import atomic_dir
from eyas.core.layer_ids import vllm_layer_ids
from eyas.export.sglang import PROVENANCE_KEYS
from eyas.export.tensors import speculators_tensors, validate_tensors
from eyas.model.drafter import DrafterConfig, Eagle3Drafter, read_drafter_config

SPECULATORS_ARCH = "Eagle3Speculator"


VERIFIER_KEY = "export.verifier"  # the config key that states how the export names its verifier
# A Hugging Face Hub model id `owner/name` (huggingface_hub's validate_repo_id rules: letters, digits,
# `-`, `_`, `.`; no `--` or `..`; at most 96 characters).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*")


def _verifier_error(verifier: str, why: str) -> ValueError:
    return ValueError(
        f"{VERIFIER_KEY}: {verifier!r} {why}. speculators (`Eagle3DraftModel.from_pretrained`) reads "
        f"the verifier's config and embedding from `speculators_config.verifier.name_or_path`, and "
        f"`vllm serve <export>` serves it as the target: set {VERIFIER_KEY} to the target's Hugging "
        f"Face Hub id (owner/name) or to the absolute path of its local model directory "
        f"(null = the job's model dir)"
    )


def _check_verifier_config(verifier: str, config: dict, cfg: DrafterConfig, where: str) -> None:
    """The verifier's config.json must describe the target the drafter was shaped from."""
    text = config.get("text_config") or config  # multimodal wrappers: the language model's config
    layers = text.get("num_hidden_layers")
    for field, want in (("hidden_size", cfg.hidden_size), ("vocab_size", cfg.vocab_size)):
        if text.get(field) != want:
            raise _verifier_error(
                verifier,
                f"is not the drafter's target: {where} has {field}={text.get(field)}, the drafter {want}",
            )
    top = max(vllm_layer_ids(cfg.aux_layer_ids))
    if not isinstance(layers, int) or top > layers:
        raise _verifier_error(
            verifier,
            f"is not the drafter's target: {where} has num_hidden_layers={layers}, the drafter taps "
            f"hidden state {top}",
        )


def check_verifier(verifier: str, cfg: DrafterConfig, target_hash: str | None = None) -> dict:
    """Refuse a verifier name the serving engines cannot resolve; say how far it was checked.

    - An existing directory must be absolute (engines resolve a relative one from their own working
      directory), hold config.json and safetensors weights (speculators reads the target's embedding,
      lm_head and final norm from them), describe the drafter's target (hidden size, vocab, enough
      layers for the taps) and, given `target_hash` (the drafter's provenance), be that very model
      (`provenance.model_hash`).
    - Otherwise it must be a Hub id `owner/name`. Offline it can only be checked where its config.json
      is in the local Hugging Face cache; elsewhere it is taken as stated (`checked: false`).
    Anything else (a bare name such as an internal model id, a path that does not exist) is refused
    with a message naming `export.verifier`. Returns {"name_or_path", "kind", "checked"}.
    """
    from eyas.core.provenance import model_hash

    if not isinstance(verifier, str) or not verifier.strip():
        raise _verifier_error(str(verifier), "is empty")
    path = Path(verifier).expanduser()
    if path.exists():
        if not path.is_absolute():
            raise _verifier_error(
                verifier,
                "is a relative path (serving engines resolve it from their own "
                "working directory; give it absolute)",
            )
        if not path.is_dir() or not (path / "config.json").is_file():
            raise _verifier_error(verifier, "is not a model directory with a config.json")
        if not any((path / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
            raise _verifier_error(verifier, "has no model.safetensors or model.safetensors.index.json")
        _check_verifier_config(verifier, json.loads((path / "config.json").read_text()), cfg, str(path))
        if target_hash is not None and model_hash(path) != target_hash:
            raise _verifier_error(
                verifier,
                "is not the model the drafter was trained on (its model_hash differs from the "
                "drafter's provenance)",
            )
        return {"name_or_path": str(path), "kind": "path", "checked": True}
    if verifier.startswith(("/", ".", "~")) or os.sep in verifier.replace("/", "", 1):
        raise _verifier_error(verifier, "is a path that does not exist")
    if not HUB_ID.fullmatch(verifier) or len(verifier) > 96 or "--" in verifier or ".." in verifier:
        raise _verifier_error(
            verifier, "is neither an existing model directory nor a Hugging Face Hub id (owner/name)"
        )
    cached = None
    try:  # the local Hugging Face cache only: export never goes to the network
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(verifier, "config.json")
    except ImportError:
        pass
    if isinstance(cached, str):
        _check_verifier_config(verifier, json.loads(Path(cached).read_text()), cfg, cached)
        return {"name_or_path": verifier, "kind": "hub", "checked": True}
    return {"name_or_path": verifier, "kind": "hub", "checked": False}


def speculators_config(
    cfg: DrafterConfig,
    verifier: str,
    verifier_architectures: list[str],
    speculative_tokens: int,
    provenance: dict | None = None,
) -> dict:
    """config.json of a vLLM speculators `Eagle3Speculator` (speculators' Eagle3SpeculatorConfig).

    Every flag the readers default is written out: vLLM 0.33.0's speculators parser
    (`transformers_utils/configs/speculators/algos.py`) takes a missing `norm_before_residual` as
    true, which is not eyas's (nor SGLang's) layer. No top-level `model_type`: vLLM recognises the
    speculators format by its absence plus `speculators_config`."""
    config = {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {
            "model_type": "llama",
            "vocab_size": cfg.vocab_size,  # the target vocab (t2d length)
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "hidden_act": cfg.hidden_act,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling,
            # transformers 5 reads rope_parameters, 4.x reads rope_theta: write both, same value.
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        },
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": False,  # eyas (like SGLang) keeps the un-normed hidden as residual
        "norm_before_fc": False,  # fc reads the raw concatenated taps
        "fc_norm": False,
        "norm_output": False,  # the next step gets the pre-norm hidden
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": vllm_layer_ids(cfg.aux_layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "torch_dtype": "bfloat16",
        # How the ids were converted, so a reader can check it (ignored by vLLM).
        "eyas_conversion": {
            "drafter_aux_layer_ids": list(cfg.aux_layer_ids),
            "drafter_convention": "output of 0-based decoder layer v",
            "eagle_aux_hidden_state_layer_ids_convention": "vllm: hidden_states index = drafter id + 1",
        },
    }
    if provenance:
        config["eyas_provenance"] = provenance
    return config


def export_speculators(
    drafter_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    verifier: str,
    verifier_architectures: list[str],
    speculative_tokens: int = 3,
) -> dict:
    """Write a vLLM speculators Eagle3Speculator dir (config.json + model.safetensors) at `out_dir`.

    The tensors are those of the SGLang export plus the target embedding the drafter was trained
    with, validated the same way; the config carries the verifier (`check_verifier`: refused unless
    it resolves) and the aux ids in vLLM's convention."""
    model = Eagle3Drafter.from_pretrained(drafter_dir)
    raw = read_drafter_config(drafter_dir)
    provenance = {k: raw[k] for k in PROVENANCE_KEYS if k in raw}
    resolved = check_verifier(verifier, model.config, raw.get("model_hash"))
    tensors = speculators_tensors(model)
    validate_tensors(tensors, model.config, "speculators")
    config = speculators_config(
        model.config, resolved["name_or_path"], verifier_architectures, speculative_tokens, provenance
    )
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {
        "out_dir": str(out_dir),
        "keys": len(tensors),
        "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
        "verifier": resolved["name_or_path"],
        "verifier_kind": resolved["kind"],
        "verifier_checked": resolved["checked"],
    }
