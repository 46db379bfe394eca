"""The in-place drafter and k select of the served-evaluation engine, in its scheduler processes.

One served engine measures every drafter at every k (`DraftSwapEngine.select(dir, k)` in
`eyas.engine.sglang`, the job-process side); the request carrying both is an update-weights request
whose `weight_version` is `eyas:steps=<k>`. sglang is imported lazily, in the scheduler process.
- Drafters: the engine's draft model takes another drafter's weights in place. SGLang's own
  `update_weights_from_disk` reloads the target and the draft from one path (sglang 0.5.17,
  `managers/scheduler_components/weight_updater.py`), so in the scheduler process eyas routes a request
  whose path is an EAGLE-3 draft dir (`LlamaForCausalLMEagle3`) to the draft runners only, with the
  loader SGLang used to load that drafter at start-up. Weights are copied into the existing tensors,
  so captured CUDA graphs stay valid; the draft vocabulary map is refreshed in place too.
- k: SGLang's adaptive speculative decoding (`speculative_adaptive`, `speculative/adaptive_*.py`)
  builds the draft/verify runtime state and CUDA graphs of every candidate step count at start-up
  and switches between them; eyas gives it the k list as candidates with an acceptance policy that
  never moves on its own (`eyas.engine.sglang_args.pinned_steps_policy`), and pins the k it measures.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("eyas.sglang")

# The EAGLE-3 draft classes eyas exports: the Llama layer and the MLA layer (`train.drafter`).
EAGLE3_DRAFT_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
STEPS_PREFIX = "eyas:steps="  # weight_version of a select request: the k to pin
LOAD_FORMAT_AUTO = "auto"  # SGLang's LoadFormat.AUTO: the dir's safetensors, else its .bin/.pt files


def is_eagle3_draft_dir(path: str | os.PathLike) -> bool:
    config = Path(path) / "config.json"
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
        return any(arch in architectures for arch in EAGLE3_DRAFT_ARCHS)
    except (OSError, ValueError):
        return False


def swap_groups(exports: dict[str, str]) -> list[list[str]]:
    """The drafters' names grouped by what one engine can swap between, in order: a swap copies weights
    into the tensors the engine built at start-up from the first drafter's config.json, so every other
    field of it (tensor shapes, the draft vocabulary, RoPE, norms, the aux layer ids) must be the same.
    eyas's provenance record is not read by SGLang and does not split a group."""
    groups: dict[str, list[str]] = {}
    for name, path in exports.items():
        config = Path(path) / "config.json"
        try:
            fields = json.loads(config.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{config}: cannot read the drafter export's config ({err})") from None
        fields.pop("eyas_provenance", None)
        groups.setdefault(json.dumps(fields, sort_keys=True), []).append(name)
    return list(groups.values())


# --------------------------------------------------------------------------- in the scheduler process
def _draft_runners(spec_worker) -> list:
    """The draft model runners of the scheduler's speculative worker: 0.5.23 lists them in
    `weight_update_runners()` as (role, runner); 0.5.17 keeps them on its inner draft worker."""
    if hasattr(spec_worker, "weight_update_runners"):
        return [runner for role, runner in spec_worker.weight_update_runners() if role == "draft"]
    return list(spec_worker.draft_worker.draft_runners)


def _refresh_hot_token_ids(draft_worker, runner) -> None:
    """The worker keeps a device copy of the draft model's `hot_token_id` (d2t + arange) taken at
    start-up; `load_weights` sets a new one on the model. Copy it in place (graphs hold the tensor)."""
    new = getattr(runner.model, "hot_token_id", None)
    for holder in (draft_worker, getattr(draft_worker, "draft_worker", None)):
        old = getattr(holder, "hot_token_id", None) if holder is not None else None
        if old is None or new is None:
            continue
        if old.shape != new.shape:
            raise ValueError(
                f"draft vocabulary of {old.shape[0]} tokens cannot become {new.shape[0]} in a running engine"
            )
        old.copy_(new.to(old.device))


def swap_draft_weights(draft_worker, path: str, load_format: str | None) -> tuple[bool, str]:
    """Load the drafter at `path` into every draft runner in place; (success, message)."""
    try:
        for runner in _draft_runners(draft_worker):
            load = load_format or LOAD_FORMAT_AUTO
            ok, message = runner.weight_updater.update_weights_from_disk(path, load)
            if not ok:
                return False, f"{path}: {message}"
            _refresh_hot_token_ids(draft_worker, runner)
    except Exception as err:  # reported to the caller, which fails the job naming the drafter
        return False, f"{path}: {type(err).__name__}: {err}"
    return True, f"draft weights loaded from {path}"


def pin_draft_steps(spec_worker, k: int) -> None:
    """Make the running EAGLE worker draft k tokens a pass: pin every adaptive slot to k and switch to
    the runtime state built for k (an engine without adaptive candidates serves its one k only)."""
    controller = getattr(spec_worker, "adaptive_controller", None)
    if controller is None:
        if spec_worker.speculative_num_steps != k:
            raise ValueError(f"this engine drafts {spec_worker.speculative_num_steps} tokens only, not {k}")
        return
    if k not in controller.candidate_steps:
        raise ValueError(f"k={k} is not one of the engine's steps {controller.candidate_steps}")
    for slot in controller.params._slots.values():
        slot.current_steps = k
    controller._activate(k)


def select_draft(spec_worker, path: str, load_format: str | None, version: str | None) -> tuple[bool, str]:
    """A select request in the scheduler: new draft weights from `path` (when it is a draft dir) and,
    when `version` is `eyas:steps=<k>`, k pinned; (success, message)."""
    if is_eagle3_draft_dir(path):
        success, message = swap_draft_weights(spec_worker, path, load_format)
        if not success:
            return success, message
    if version and version.startswith(STEPS_PREFIX):
        try:
            pin_draft_steps(spec_worker, int(version.removeprefix(STEPS_PREFIX)))
        except Exception as err:  # reported to the caller, which fails the job
            return False, f"{type(err).__name__}: {err}"
    return True, f"serving {path} at {version}"


def install_draft_swap() -> None:
    """Route update-weights requests for an EAGLE-3 draft dir, or tagged `eyas:steps=<k>`, to
    `select_draft` (the draft runners and the step count only); others go to SGLang's own."""
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput
    from sglang.srt.managers.scheduler_components import weight_updater

    manager = weight_updater.SchedulerWeightUpdaterManager
    original = manager.update_weights_from_disk
    if getattr(original, "eyas_draft_swap", False):
        return

    @functools.wraps(original)
    def update_weights_from_disk(self, recv_req):
        ours = is_eagle3_draft_dir(recv_req.model_path) or (recv_req.weight_version or "").startswith(
            STEPS_PREFIX
        )
        if not ours or self.draft_worker is None:
            return original(self, recv_req)
        success, message = select_draft(
            self.draft_worker, recv_req.model_path, recv_req.load_format, recv_req.weight_version
        )
        if success:
            self.flush_cache()  # nothing is cached across drafters (radix cache off); frees the pool
        else:
            log.error(message)
        return UpdateWeightFromDiskReqOutput(success=success, message=message, num_paused_requests=0)

    update_weights_from_disk.eyas_draft_swap = True
    manager.update_weights_from_disk = update_weights_from_disk


def draft_swap_scheduler_process(*args, **kwargs):
    """`run_scheduler_process_func` of `DraftSwapEngine`: install the swap, then run SGLang's."""
    install_draft_swap()
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)
