"""Exact-resume checkpoints: the files of one on disk (written, verified, loaded), and the
`Checkpointer` that saves the run state (run_state.py: `RunState` and the RNG states) with the weights,
optimizer and scheduler, restores it, keeps the best epoch's weights and writes the final drafter
directory.

A checkpoint is a directory (model.safetensors + config.json of the drafter, train_state.pt with the
rest). `train_state.pt` holds only tensors and plain Python values, so it loads with
`torch.load(weights_only=True)`; numpy's RNG state is stored as a tensor for that reason.
Two checkpoints are kept: the latest (`<out_dir>-checkpoint`) and the one before it
(`<out_dir>-checkpoint.previous`). A new one is written completely under a temporary name with
`checksums.json` (its step and every file's size and sha256) last; only then does the latest become
the previous one and the new one the latest, by renames. A failed write (a full disk) removes the
partial copy and leaves both intact; a kill between the renames leaves the previous one whole.
Resume verifies a checkpoint before using it (its manifest, that train_state.pt loads and is at the
manifest's step, every file's size and sha256) and falls back to the previous one, with a warning
naming the file and what is wrong, when the latest is cut short, zeroed or at the wrong step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from eyas.config import TrainSettings
from eyas.core.atomic import atomic_dir
from eyas.core.diskspace import check_fits, gib
from eyas.model.drafter import Eagle3Drafter
from eyas.train import distributed
from eyas.train.run_state import RunState, rng_state, set_rng_state

if TYPE_CHECKING:
    from eyas.train.parallel import Replicated

log = logging.getLogger("eyas.train")

# Settings that do not change the maths: a checkpoint made under other values still resumes.
NOT_FINGERPRINTED = ("progress", "checkpoint_every", "device", "loader_readers", "loader_processes")


def checkpoint_dir(out_dir: str | os.PathLike) -> Path:
    out = Path(out_dir)
    return out.with_name(out.name + "-checkpoint")


def fingerprint(settings: TrainSettings, inputs: dict) -> str:
    """sha256 of the settings that change the result and the identities of the inputs."""
    relevant = {k: v for k, v in dataclasses.asdict(settings).items() if k not in NOT_FINGERPRINTED}
    return hashlib.sha256(json.dumps([relevant, inputs], sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- save / load
MANIFEST = "checksums.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (the previous ones are left as they were)."""


class CheckpointInvalid(Exception):
    """A checkpoint on disk fails verification; the message names the file and what is wrong."""


# On disk at once while a checkpoint is written: the new one, the latest and the previous (removed only
# once the new one is complete), besides the best epoch's weights and the output's.
CHECKPOINTS_ON_DISK = 3


def checkpoint_bytes(model: nn.Module) -> int:
    """A checkpoint's size: the drafter's weights and AdamW's two moments of each trained weight."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return weights + moments


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def previous_dir(path: Path) -> Path:
    return path.with_name(path.name + ".previous")


def _corrupt_dir(path: Path) -> Path:
    return path.with_name(path.name + ".corrupt")


def _legacy_aside(path: Path) -> Path:
    """Where eyas before the kept previous checkpoint renamed the old one during a replace."""
    return path.with_name(path.name + ".old")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _rename_away(path: Path) -> None:
    """Delete directory `path` without ever leaving it half-deleted under its own name."""
    if path.exists():
        trash = path.with_name(f".{path.name}.del-{os.getpid()}")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


class _KeepsOSError:
    """A file for torch.save that keeps the OS error of a failed write: torch's zip writer may report
    it only as "unexpected pos N vs M" (seen with ENOSPC on a full tmpfs), which names no cause."""

    def __init__(self, fh):
        self.fh, self.error = fh, None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def save_checkpoint(
    path: Path, model: Eagle3Drafter, extra_config: dict, state: dict, latest_is_bad: bool = False
) -> None:
    """Write the checkpoint at `path`, the old one kept as `previous_dir(path)` (see the module doc).
    `latest_is_bad`: the checkpoint now at `path` failed verification; it is set aside as
    `<path>.corrupt` instead of becoming the previous one (which stays the good one resumed from)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    writer = None
    try:
        model.save_pretrained(tmp, extra_config=extra_config)  # itself atomic
        with open(tmp / "train_state.pt", "wb") as fh:
            torch.save(state, writer := _KeepsOSError(fh))
        files = {}
        for f in sorted(tmp.iterdir()):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            files[f.name] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        with open(tmp / MANIFEST, "w") as fh:
            json.dump({"step": state["step"], "files": files}, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception):
            cause = writer.error if writer is not None and writer.error is not None else exc
            raise CheckpointError(
                f"{path}: writing the checkpoint of step {state['step']} failed ({cause}); the partial "
                f"copy was removed and the checkpoints already there are unchanged"
            ) from cause
        raise
    previous = previous_dir(path)
    if path.exists():
        if latest_is_bad:
            _rename_away(_corrupt_dir(path))
            os.replace(path, _corrupt_dir(path))
        else:
            _rename_away(previous)
            os.replace(path, previous)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    _rename_away(_legacy_aside(path))


def verify_checkpoint(path: Path) -> dict:
    """The train state of the checkpoint directory `path` after checking it against its manifest;
    raises CheckpointInvalid naming the file and what is wrong."""
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        step, files = int(manifest["step"]), dict(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointInvalid(f"{manifest_path}: missing or unreadable ({exc})") from exc
    state_path = path / "train_state.pt"
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # cut short or overwritten: torch/pickle raise various types
        raise CheckpointInvalid(f"{state_path}: cannot be loaded ({exc})") from exc
    if not isinstance(state, dict) or state.get("step") != step or len(state.get("log_rows", ())) != step:
        got = state.get("step") if isinstance(state, dict) else type(state).__name__
        raise CheckpointInvalid(f"{state_path}: field 'step' is {got!r}, {manifest_path} says {step}")
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointInvalid(f"{f}: missing (listed in {manifest_path})")
        if f.stat().st_size != want["bytes"]:
            raise CheckpointInvalid(f"{f}: {f.stat().st_size} bytes, {manifest_path} says {want['bytes']}")
        if _sha256(f) != want["sha256"]:
            raise CheckpointInvalid(f"{f}: sha256 differs from {manifest_path} (bytes changed on disk)")
    return state


def load_checkpoint(path: Path) -> tuple[Path, dict, list[str]] | None:
    """(directory, train state, problems) of the newest checkpoint at `path` that verifies: the
    latest, else the previous one (else a legacy aside copy). `problems` says what was wrong with
    each newer one skipped. None when there is none; raises CheckpointInvalid (naming every file and
    problem) when there are checkpoints but none verifies."""
    path = Path(path)
    problems = []
    for candidate in (path, previous_dir(path), _legacy_aside(path)):
        if not candidate.exists():
            continue
        try:
            return candidate, verify_checkpoint(candidate), problems
        except CheckpointInvalid as exc:
            problems.append(str(exc))
    if problems:
        raise CheckpointInvalid("; ".join(problems))
    return None


def remove_checkpoint(path: Path) -> None:
    for p in (Path(path), previous_dir(Path(path)), _corrupt_dir(Path(path)), _legacy_aside(Path(path))):
        shutil.rmtree(p, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    """Make renames inside directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the checkpointer
class Checkpointer:
    """Owns the checkpoint directory beside `out_dir`: finding a resumable one, saving, restoring,
    keeping the best epoch's weights (`<out_dir>-best`) and writing the final drafter at `out_dir`.

    Only checkpoints with this run's `fingerprint` are resumed. Saving is collective (every rank
    calls it); files are written by rank 0."""

    def __init__(self, out_dir: str | os.PathLike, fp: str, extra_config: dict, world: distributed.World):
        self.out_dir = Path(out_dir)
        self.dir = checkpoint_dir(out_dir)
        self.best_dir = self.out_dir.with_name(self.out_dir.name + "-best")
        self.fingerprint = fp
        self.extra_config = extra_config
        self.world = world
        self.last: tuple[Path, int] | None = None
        """(directory, step) of the newest checkpoint this run saved or resumed from."""
        self.latest_is_bad = False
        """The checkpoint at `dir` failed verification (the next save sets it aside, see `find`)."""

    def check_disk(self, model: nn.Module) -> None:
        """Rank 0: refuse (`DiskSpaceError`) a run whose checkpoints and outputs will not fit beside
        `out_dir`; what earlier runs left there (resumed from, replaced) counts as already taken."""
        if not self.world.main:
            return
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        need = CHECKPOINTS_ON_DISK * checkpoint_bytes(model) + 2 * weights
        dirs = (self.dir, previous_dir(self.dir), self.best_dir, self.out_dir)
        need -= sum(_dir_bytes(d) for d in dirs)
        what = (
            f"train: {CHECKPOINTS_ON_DISK} checkpoints of {gib(checkpoint_bytes(model))} and 2 drafter copies"
        )
        check_fits(self.dir, need, what)

    def find(self) -> tuple[Path, dict] | None:
        """(directory, train state) of a checkpoint this run can resume from, or None. A latest
        checkpoint that fails verification is skipped for the previous one, with a warning naming
        the file; when none verifies, training starts from step 0 with an error-level message saying
        so (never silently, never a stop that needs the files removed by hand)."""
        try:
            found = load_checkpoint(self.dir)
        except CheckpointInvalid as exc:
            self.latest_is_bad = True
            log.error("no usable checkpoint, starting from step 0: %s", exc)
            return None
        if found is None:
            return None
        path, state, problems = found
        if problems:
            self.latest_is_bad = path != self.dir
            log.warning("%s; resuming from the previous checkpoint %s (step %d) instead",
                        "; ".join(problems), path, state["step"])  # fmt: skip
        if state["fingerprint"] != self.fingerprint:
            log.warning("%s: checkpoint is from different settings or inputs; starting fresh", path)
            return None
        return path, state

    @staticmethod
    def load_weights(model: nn.Module, found: tuple[Path, dict], device: torch.device) -> None:
        """The checkpoint's weights into the whole model (before it is spread over the ranks)."""
        model.load_state_dict(Eagle3Drafter.from_pretrained(found[0], map_location=device).state_dict())

    def restore(
        self,
        found: tuple[Path, dict],
        run: RunState,
        spread: Replicated,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
    ) -> None:
        """Optimizer, scheduler, RNG states and the run state from a checkpoint `find` returned."""
        path, state = found
        spread.load_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        for name in ("step", "epoch", "group_in_epoch", "tokens", "seconds", "epochs", "best"):
            setattr(run, name, state[name])
        run.log_rows = state["log_rows"]
        if self.world.main:  # the checkpoint holds the all-rank count; other ranks add their own
            run.seen = state["seen"].clone()
        self.last = (path, run.step)
        log.info("resuming from %s at step %d (epoch %d, step group %d)", path, run.step, run.epoch,
                 run.group_in_epoch)  # fmt: skip

    def save(
        self,
        run: RunState,
        spread: Replicated,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
    ) -> Eagle3Drafter | None:
        """Save a checkpoint; returns the gathered drafter it saved (rank 0; None elsewhere)."""
        state = {  # collectives (seen, sharded optimizer state): every rank takes part
            "fingerprint": self.fingerprint,
            "step": run.step,
            "epoch": run.epoch,
            "group_in_epoch": run.group_in_epoch,
            "tokens": run.tokens,
            "seconds": run.seconds,
            "optimizer": spread.optimizer_state(optimizer),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            "seen": distributed.all_reduce_sum(run.seen.clone(), self.world),
            "log_rows": run.log_rows,
            "epochs": run.epochs,
            "best": run.best,
        }
        whole = spread.full_drafter()
        if self.world.main:
            save_checkpoint(self.dir, whole, self.extra_config, state, self.latest_is_bad)
        self.latest_is_bad = False
        distributed.barrier(self.world)
        self.last = (self.dir, run.step)
        return whole

    def keep_if_best(self, run: RunState, record: dict, whole: Eagle3Drafter) -> None:
        """Rank 0: keep `whole` as the output's weights if this epoch's simulated tau is the best yet."""
        if not run.best or record["simulated_tau"] > run.best["simulated_tau"]:
            run.best = {
                "epoch": record["epoch"],
                "step": record["step"],
                "simulated_tau": record["simulated_tau"],
            }
            whole.save_pretrained(self.best_dir, extra_config=self.extra_config)

    def write_output(self, whole: Eagle3Drafter, stats: dict, best: bool) -> None:
        """Rank 0, after the last `save`: the drafter at `out_dir` (atomic) with the last checkpoint's
        train state; the best epoch's weights replace the last ones when `best`."""
        with atomic_dir(self.out_dir) as tmp:
            whole.save_pretrained(tmp, extra_config={**self.extra_config, "train_stats": stats})
            if best:
                shutil.copy(self.best_dir / "model.safetensors", tmp / "model.safetensors")
            shutil.copy(self.dir / "train_state.pt", tmp / "train_state.pt")

    def remove(self) -> None:
        """Rank 0, once the output is written: it holds the same state."""
        remove_checkpoint(self.dir)
        shutil.rmtree(self.best_dir, ignore_errors=True)
