"""Exact-resume checkpoints: model, optimizer, scheduler, RNG states, sampler position, step, log rows.

A checkpoint is a directory (model.safetensors + config.json of the drafter, train_state.pt with the
rest). `train_state.pt` holds only tensors and plain Python values, so it loads with
`torch.load(weights_only=True)`; numpy's RNG state is stored as a tensor for that reason.
Replacing a checkpoint never leaves a moment without one: the new one is written completely under a
temporary name, the old one is renamed aside, the new one renamed into place, then the old one
deleted; a reader that finds only the aside copy (a kill between the two renames) uses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from eyas.model.drafter import Eagle3Drafter

# Settings that do not change the maths: a checkpoint made under other values still resumes.
NOT_FINGERPRINTED = ("progress", "threads", "checkpoint_every", "device")


def checkpoint_dir(out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    return out.with_name(out.name + "-checkpoint")


def fingerprint(settings, inputs: dict) -> str:
    """sha256 of the settings that change the result and the identities of the inputs."""
    relevant = {k: v for k, v in dataclasses.asdict(settings).items() if k not in NOT_FINGERPRINTED}
    return hashlib.sha256(json.dumps([relevant, inputs], sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- RNG states
def rng_state() -> dict:
    """Every RNG a training step could draw from (torch CPU, CUDA, numpy, Python)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- save / load
def _aside(path: Path) -> Path:
    return path.with_name(path.name + ".old")


def save_checkpoint(path: Path, model: Eagle3Drafter, extra_config: dict, state: dict) -> None:
    """Write the checkpoint at `path`; there is a complete checkpoint on disk at every moment."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, extra_config=extra_config)  # itself atomic
    torch.save(state, tmp / "train_state.pt")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    aside = _aside(path)
    shutil.rmtree(aside, ignore_errors=True)
    if path.exists():
        os.replace(path, aside)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    shutil.rmtree(aside, ignore_errors=True)


def load_checkpoint(path: Path) -> tuple[Path, dict] | None:
    """(directory, train state) of the checkpoint at `path` (or its aside copy), or None."""
    for candidate in (Path(path), _aside(Path(path))):
        state_path = candidate / "train_state.pt"
        if state_path.exists():
            return candidate, torch.load(state_path, map_location="cpu", weights_only=True)
    return None


def remove_checkpoint(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(_aside(Path(path)), ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    """Make renames inside directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
