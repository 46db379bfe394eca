"""Export a trained drafter for serving: SGLang's `LlamaForCausalLMEagle3` dir and a vLLM speculators
`Eagle3Speculator` dir.

SGLang skips unknown weight names silently (`LlamaForCausalLMEagle3.load_weights`, sglang 0.5.23),
so a misnamed tensor would serve a drafter
with random weights: the exact key set, shapes and dtypes are validated against the config here.
The speculators export also carries `embed_tokens.weight` (speculators 0.9.0 leaves a missing one at
zeros without a warning) and names a verifier that resolves (`check_verifier`, key `export.verifier`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from eyas.atomic import atomic_dir
from eyas.layer_ids import sglang_layer_ids, tap_ids_from_sglang, tap_ids_from_vllm, vllm_layer_ids
from eyas.model.drafter import DrafterConfig, Eagle3Drafter, read_drafter_config
from eyas.provenance import DRAFTER_PROVENANCE

PROVENANCE_KEYS = (*DRAFTER_PROVENANCE, "draft_vocab_hash")


def sglang_config(
    cfg: DrafterConfig, provenance: dict | None = None, target_model_type: str = "llama"
) -> dict:
    """config.json for SGLang's LlamaForCausalLMEagle3 (a one-layer Llama + EAGLE-3 fields).

    The aux ids are in SGLang's convention for the target's family (`eyas.layer_ids`): the
    serving engine hands them to the target's `set_eagle3_layers_to_capture`."""
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        # transformers 5 reads rope_parameters, 4.x reads rope_theta: write both, same value.
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(target_model_type, cfg.aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    }
    # ignored by SGLang, kept for traceability and for reading the ids back
    config["eyas_provenance"] = {**(provenance or {}), "target_model_type": target_model_type}
    return config


def expected_tensors(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every key SGLang loads for this config, with its shape and dtype."""
    h, nh, nkv, hd, i = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )
    bf = torch.bfloat16
    return {
        "fc.weight": ((h, 3 * h), bf),
        "layers.0.self_attn.q_proj.weight": ((nh * hd, 2 * h), bf),
        "layers.0.self_attn.k_proj.weight": ((nkv * hd, 2 * h), bf),
        "layers.0.self_attn.v_proj.weight": ((nkv * hd, 2 * h), bf),
        "layers.0.self_attn.o_proj.weight": ((h, nh * hd), bf),
        "layers.0.mlp.gate_proj.weight": ((i, h), bf),
        "layers.0.mlp.up_proj.weight": ((i, h), bf),
        "layers.0.mlp.down_proj.weight": ((h, i), bf),
        "layers.0.input_layernorm.weight": ((h,), bf),
        "layers.0.hidden_norm.weight": ((h,), bf),
        "layers.0.post_attention_layernorm.weight": ((h,), bf),
        "norm.weight": ((h,), bf),
        "lm_head.weight": ((cfg.draft_vocab_size, h), bf),
        "d2t": ((cfg.draft_vocab_size,), torch.int64),
        "t2d": ((cfg.vocab_size,), torch.bool),
    }


def expected_speculators_tensors(cfg: DrafterConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The SGLang keys plus `embed_tokens.weight` [V, H]: speculators 0.9.0 builds its embedding
    from the checkpoint and, when the key is absent, leaves it at zeros (no warning) under
    transformers 5.19; vLLM 0.33.0 loads it and shares the target's instead when the two are equal."""
    return {
        **expected_tensors(cfg),
        "embed_tokens.weight": ((cfg.vocab_size, cfg.hidden_size), torch.bfloat16),
    }


EXPORT_KINDS = {
    "sglang": ("SGLang", expected_tensors),
    "speculators": ("speculators", expected_speculators_tensors),
}


def validate_tensors(tensors: dict[str, torch.Tensor], cfg: DrafterConfig, kind: str = "sglang") -> None:
    """Raise naming the first key that is missing, unexpected, or of the wrong shape or dtype.
    kind: `sglang` or `speculators` (which key set)."""
    label, expected = EXPORT_KINDS[kind]
    want = expected(cfg)
    for key in sorted(set(want) - set(tensors)):
        raise ValueError(f"{label} export: key {key!r} missing")
    for key in sorted(set(tensors) - set(want)):
        raise ValueError(f"{label} export: unexpected key {key!r} (the engine would skip it silently)")
    for key, (shape, dtype) in want.items():
        t = tensors[key]
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(
                f"{label} export: key {key!r} is {tuple(t.shape)} {t.dtype}, expected {shape} {dtype}"
            )


def sglang_tensors(model: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """The drafter's state dict in SGLang form: bf16 weights, int64 d2t, bool t2d, no embedding."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "embed_tokens.weight":
            continue  # SGLang shares the target's embedding
        out[name] = (
            t.detach().cpu().contiguous() if name in ("d2t", "t2d") else t.detach().cpu().to(torch.bfloat16)
        )
    return out


def speculators_tensors(model: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """The SGLang tensors plus the embedding the drafter was trained with (the target's), in bf16."""
    embed = model.embed_tokens.weight.detach().cpu().to(torch.bfloat16).contiguous()
    return {**sglang_tensors(model), "embed_tokens.weight": embed}


def export_sglang(
    drafter_dir: str | os.PathLike, out_dir: str | os.PathLike, target_model_type: str = "llama"
) -> dict:
    """Write `config.json` + `model.safetensors` for SGLang at `out_dir` (atomic). Returns a summary.
    `target_model_type`: the target's HF model_type (`eyas.layer_ids.text_model_type`)."""
    model = Eagle3Drafter.from_pretrained(drafter_dir)
    raw = read_drafter_config(drafter_dir)
    provenance = {k: raw[k] for k in PROVENANCE_KEYS if k in raw}
    tensors = sglang_tensors(model)
    validate_tensors(tensors, model.config)
    config = sglang_config(model.config, provenance, target_model_type)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    size = (Path(out_dir) / "model.safetensors").stat().st_size
    return {
        "out_dir": str(out_dir),
        "keys": len(tensors),
        "parameters": int(sum(t.numel() for k, t in tensors.items() if k not in ("d2t", "t2d"))),
        "bytes": size,
        "draft_vocab_size": model.config.draft_vocab_size,
        "aux_layer_ids": list(model.config.aux_layer_ids),
        "sglang_aux_layer_ids": config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
    }


# --------------------------------------------------------------------------- vLLM speculators
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
    from eyas.provenance import model_hash

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


# --------------------------------------------------------------------------- reload (round trip)
def load_export(export_dir: str | os.PathLike, embed: torch.Tensor | None = None) -> Eagle3Drafter:
    """Rebuild a drafter from an export dir, reading only what the serving engine reads.

    The config is parsed from the export's own fields (SGLang or speculators layout, vLLM ids
    converted back). embed [V, H]: the target embedding SGLang shares, required for an SGLang
    export; a speculators export uses its own. Used to check that an export computes what the
    trained model computes."""
    from safetensors.torch import load_file

    export_dir = Path(export_dir)
    raw = json.loads((export_dir / "config.json").read_text())
    if raw.get("architectures") == [SPECULATORS_ARCH]:
        kind = "speculators"
        layer = raw["transformer_layer_config"]
        aux = tap_ids_from_vllm(raw["eagle_aux_hidden_state_layer_ids"])
    elif raw.get("architectures") == ["LlamaForCausalLMEagle3"]:
        kind = "sglang"
        layer = raw
        model_type = raw.get("eyas_provenance", {}).get("target_model_type", "llama")
        aux = tap_ids_from_sglang(model_type, raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    else:
        raise ValueError(
            f"{export_dir / 'config.json'}: field 'architectures' is {raw.get('architectures')!r}"
        )
    cfg = DrafterConfig(
        hidden_size=layer["hidden_size"],
        intermediate_size=layer["intermediate_size"],
        num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"],
        head_dim=layer["head_dim"],
        rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=layer["rope_theta"],
        max_position_embeddings=layer["max_position_embeddings"],
        vocab_size=layer["vocab_size"],
        draft_vocab_size=raw["draft_vocab_size"],
        aux_layer_ids=aux,
        hidden_act=layer["hidden_act"],
        rope_scaling=layer.get("rope_scaling"),
    )
    tensors = load_file(str(export_dir / "model.safetensors"))
    validate_tensors(tensors, cfg, kind)
    model = Eagle3Drafter(cfg)
    state = {k: (v if k in ("d2t", "t2d") else v.float()) for k, v in tensors.items()}
    if kind == "sglang":
        if embed is None:
            raise ValueError(f"{export_dir}: an SGLang export has no embedding: pass the target's")
        state["embed_tokens.weight"] = embed.float()
    model.load_state_dict(state, strict=True)
    return model.eval()
