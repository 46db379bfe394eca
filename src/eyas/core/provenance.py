"""Hashes and identity facts that travel with every data product."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eyas import __version__

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EYAS_VERSION = __version__
FINAL_NORM = "post_norm"  # final state is after the target's final norm
# What a drafter records of the stores it was trained on, and what evaluation checks stores against.
DRAFTER_PROVENANCE = (
    "model_id",
    "model_hash",
    "layer_ids",
    "layer_id_convention",
    "tokenizer_hash",
    "chat_template_hash",
)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_array(array: np.ndarray) -> str:
    return sha256_bytes(np.ascontiguousarray(array).tobytes())


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """Hash of the tokenizer's vocabulary, merges and special tokens (its full serialized state)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return sha256_text(backend.to_str())
    vocab = sorted(tokenizer.get_vocab().items())
    return sha256_text(json.dumps(vocab, ensure_ascii=False))


def chat_template_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    return sha256_text(tokenizer.chat_template or "")


def model_hash(model_dir: str | os.PathLike) -> str:
    """Fingerprint of a target: config.json plus each weight file's name, size and safetensors header.

    The header lists every tensor's name, dtype, shape and byte range, so any change of architecture
    or re-export shows; reading it costs microseconds where hashing a 1T-parameter checkpoint's bytes
    would cost hours per job.
    """
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    config = model_dir / "config.json"
    if config.exists():
        digest.update(config.read_bytes())
    for weights in sorted(model_dir.glob("*.safetensors")):
        digest.update(weights.name.encode())
        digest.update(str(weights.stat().st_size).encode())
        with open(weights, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            digest.update(fh.read(header_len))
    return digest.hexdigest()
