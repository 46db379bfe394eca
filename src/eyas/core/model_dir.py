"""Checks of a target model dir from its files alone, before any job: no transformers or torch import
(the Snakefile calls `check_model_dir` when it is parsed), no weights read. Each error names the path
and the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


class ModelDirError(ValueError):
    pass


def _transformers_knows(model_type: str) -> bool:
    """Whether the installed transformers has a built-in model package for `model_type` (read from its
    files, without importing it: `transformers/models/<type>/`)."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return True  # cannot tell; loading will say
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    return (models / model_type.replace("-", "_")).is_dir()


def _tokenizer_max_id(path: Path) -> int | None:
    """The largest token id of a `tokenizer.json` (its model vocab and added tokens); None if unknown."""
    data = json.loads(path.read_text("utf-8"))
    vocab = (data.get("model") or {}).get("vocab")
    ids = [int(a["id"]) for a in data.get("added_tokens") or []]
    if isinstance(vocab, dict):
        ids += [int(i) for i in vocab.values()]
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids are positions
        ids.append(len(vocab) - 1)
    return max(ids) if ids else None


def _read_config(config_path: Path) -> dict:
    if not config_path.is_file():
        raise ModelDirError(
            f"target model: {config_path} does not exist (model.source must be a Hugging Face model dir)"
        )
    try:
        config = json.loads(config_path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f":{err.lineno}:{err.colno}" if isinstance(err, json.JSONDecodeError) else ""
        raise ModelDirError(f"target model: {config_path}{where}: not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise ModelDirError(f"target model: {config_path}: expected a JSON object")
    return config


def _check_weights(model_dir: Path, names: set[str]) -> None:
    """Safetensors weights only: eyas reads tensors by name from them and never unpickles."""
    if any(n.endswith(".safetensors") for n in names):
        return
    pickled = sorted(n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt")))
    if pickled:
        raise ModelDirError(
            f"target model: {model_dir} has weights only as pickles ({', '.join(pickled[:3])}); eyas "
            "loads safetensors only. Fix: convert once where you trust the file, e.g. "
            "`AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW)` (safetensors by default)"
        )
    raise ModelDirError(f"target model: {model_dir} has no *.safetensors weights")


def _check_tokenizer_files(model_dir: Path, names: set[str]) -> None:
    """Tokenizer files and a chat template."""
    if not names & {"tokenizer.json", "tokenizer_config.json"}:
        raise ModelDirError(
            f"target tokenizer: {model_dir} has no tokenizer.json or tokenizer_config.json. Fix: copy the "
            "tokenizer files of the model's release (tokenizer.json, tokenizer_config.json, chat template) "
            "into the dir"
        )
    tokenizer_config = {}
    if "tokenizer_config.json" in names:
        tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text("utf-8"))
    if not tokenizer_config.get("chat_template") and not names & {
        "chat_template.jinja",
        "chat_template.json",
    }:
        raise ModelDirError(
            f"target tokenizer: {model_dir} has no chat template (tokenizer_config.json `chat_template`, "
            "chat_template.jinja): a base model? Fix: use the instruct/chat release of the model, or add "
            "its chat_template.jinja to the dir"
        )


def _check_vocab(model_dir: Path, names: set[str], config: dict) -> None:
    """The tokenizer's ids fit the model's vocab_size."""
    text_config = config.get("text_config") or config
    vocab_size = text_config.get("vocab_size", config.get("vocab_size"))
    if "tokenizer.json" in names and isinstance(vocab_size, int):
        max_id = _tokenizer_max_id(model_dir / "tokenizer.json")
        if max_id is not None and max_id >= vocab_size:
            raise ModelDirError(
                f"target model: {model_dir}: the tokenizer has token id {max_id} but config.json "
                f"vocab_size is {vocab_size}: the tokenizer belongs to another model. Fix: put the "
                "model's own tokenizer files in the dir"
            )


def _check_model_type(
    model_dir: Path, config_path: Path, config: dict, backend: str, trust_remote_code: bool
) -> None:
    """A model_type the installed transformers does not know comes with code (`auto_map`) that
    trust_remote_code allows (the `hf` backend needs one or the other)."""
    model_type = str(config.get("model_type") or "")
    if not model_type or _transformers_knows(model_type):
        return
    if not config.get("auto_map"):
        if backend == "hf":  # SGLang has model classes of its own; the hf backend has only these
            raise ModelDirError(
                f"target model: {config_path}: model_type {model_type!r} is unknown to the installed "
                "transformers and the dir has no custom code (auto_map). Fix: a newer transformers"
            )
    elif not trust_remote_code:
        raise ModelDirError(
            f"target model: {model_dir} needs its own modelling code (model_type {model_type!r}, "
            f"auto_map in config.json). Fix: read the dir's *.py and, if you trust them, set "
            "model.trust_remote_code: true"
        )


def _check_causal_lm(config_path: Path, config: dict, backend: str) -> None:
    """The `hf` backend runs decoder-only causal LMs only."""
    architectures = [str(a) for a in config.get("architectures") or []]
    if backend == "hf" and (
        config.get("is_encoder_decoder")
        or (architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures))
    ):
        raise ModelDirError(
            f"target model: {config_path}: architectures {architectures} "
            f"{'(encoder-decoder) ' if config.get('is_encoder_decoder') else ''}are not a decoder-only "
            "causal LM, which extract.backend hf runs (architectures ending in "
            f"{', '.join(CAUSAL_LM_SUFFIXES)}). Fix: a decoder-only target"
        )


def check_model_dir(
    model_dir: str | os.PathLike, backend: str = "hf", trust_remote_code: bool = False
) -> None:
    """Refuse a target dir the pipeline cannot use, naming the path and the fix, from its files alone
    (no transformers import, no weights read: the Snakefile runs it before any job).

    Checked: config.json parses; weights are safetensors (eyas reads tensors by name from them and
    never unpickles `.bin`); tokenizer files and a chat template are there; the tokenizer's ids fit the
    model's vocab_size; the architecture is a causal LM the `hf` backend can run; a model_type the
    installed transformers does not know comes with code (`auto_map`) and trust_remote_code is set."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    config = _read_config(config_path)
    names = {p.name for p in model_dir.iterdir()}
    _check_weights(model_dir, names)
    _check_tokenizer_files(model_dir, names)
    _check_vocab(model_dir, names, config)
    _check_model_type(model_dir, config_path, config, backend, trust_remote_code)
    _check_causal_lm(config_path, config, backend)
