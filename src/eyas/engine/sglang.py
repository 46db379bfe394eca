"""SGLang engines for eyas's three uses: hidden-state extraction, regeneration and served evaluation.

This module and `extract/sglang_backend.py` (the capture hook inside the scheduler process) are the only
ones that import sglang, always lazily: the argument builders are pure and run anywhere. Nothing in
SGLang's files is edited: eyas starts stock engines and hooks them from outside. One function builds the
arguments every engine shares (`base_engine_args`: the target, TP, memory, attention backend, the user's
`engine_args`, all from the config's one `sglang` section); each use adds its own:

- served evaluation: EAGLE-3 chain drafting of k tokens, i.e. `speculative_num_steps=k,
  speculative_eagle_topk=1, speculative_num_draft_tokens=k+1` (SGLang's own benchmark settings,
  e.g. `benchmark/` and the EAGLE-3 section of docs/advanced_features/speculative_decoding.md), and
  a plain engine with the same settings as the reference;
- regeneration: a plain engine that samples.

One served engine measures every drafter at every k: `DraftSwapEngine.select(dir, k)`.
- Drafters: the engine's draft model takes another drafter's weights in place. SGLang's own
  `update_weights_from_disk` reloads the target and the draft from one path (sglang 0.5.17,
  `managers/scheduler_components/weight_updater.py`), so in the scheduler process eyas routes a request
  whose path is an EAGLE-3 draft dir (`LlamaForCausalLMEagle3`) to the draft runners only, with the
  loader SGLang used to load that drafter at start-up. Weights are copied into the existing tensors,
  so captured CUDA graphs stay valid; the draft vocabulary map is refreshed in place too.
- k: SGLang's adaptive speculative decoding (`speculative_adaptive`, `speculative/adaptive_*.py`)
  builds the draft/verify runtime state and CUDA graphs of every candidate step count at start-up
  and switches between them; eyas gives it the k list as candidates with an acceptance policy that
  never moves on its own (its warm-up never ends), and pins the k it measures.
The request carrying both is an update-weights request whose `weight_version` is `eyas:steps=<k>`.

Regeneration's and served evaluation's engines (`start_engine`) are `EyasEngine`s: when one of its
processes dies, the engine's start or the call in flight raises `EngineDied` naming the stage, instead
of SGLang killing the job process (`_death_handler_class`); the stage's `finally` blocks run, and as
its outputs are written atomically once the engine's work is done, nothing that looks finished is left.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from pathlib import Path

from eyas.config import SglangSettings
from eyas.core.logs import child_stage_logging, keep_stage_logging

log = logging.getLogger("eyas.sglang")

TESTED = ((0, 5, 17), (0, 5, 23))  # inclusive range of releases eyas was built and tested against
# The EAGLE-3 draft classes eyas exports: the Llama layer and the MLA layer (`train.drafter`).
EAGLE3_DRAFT_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
STEPS_PREFIX = "eyas:steps="  # weight_version of a select request: the k to pin
NEVER = 2**62  # the adaptive policy's warm-up, in verify batches: it never adapts by itself
LOAD_FORMAT_AUTO = "auto"  # SGLang's LoadFormat.AUTO: the dir's safetensors, else its .bin/.pt files
# Args every eyas engine sets itself (from its own config keys): never from `engine_args`.
BASE_OWNED_ARGS = frozenset(
    {
        "model_path",
        "tp_size",
        "mem_fraction_static",
        "chunked_prefill_size",
        "attention_backend",
        "skip_tokenizer_init",
        "dtype",
        "trust_remote_code",
    }
)
SPECULATIVE_ARGS = frozenset(
    {
        "speculative_algorithm",
        "speculative_draft_model_path",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    }
)
SERVED_OWNED_ARGS = (
    BASE_OWNED_ARGS
    | SPECULATIVE_ARGS
    | {
        "max_running_requests",
        "disable_radix_cache",
        "cuda_graph_max_bs_decode",
    }
)

GENERATION_OWNED_ARGS = BASE_OWNED_ARGS | {
    "random_seed",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
    "disable_prefill_cuda_graph",
}


# --------------------------------------------------------------------------- pure helpers
def parse_version(version: str) -> tuple[int, int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in (parts + ["0", "0"])[:3])
    except ValueError as err:
        raise ValueError(f"sglang version {version!r} is not of the form X.Y.Z") from err


def check_tested(version: str, stage: str) -> tuple[int, int, int]:
    parsed = parse_version(version)
    if not TESTED[0] <= parsed <= TESTED[1]:
        lo, hi = (".".join(map(str, v)) for v in TESTED)
        raise RuntimeError(
            f"{stage}: sglang {version} is outside the tested range {lo}-{hi}; pin one of those"
        )
    return parsed


def user_engine_args(
    extra: dict,
    known: set[str] | None,
    owned: frozenset[str] = BASE_OWNED_ARGS,
    section: str = "sglang.engine_args",
) -> dict:
    """`sglang.engine_args` (or the config key `section`), refused if a key is one eyas sets itself
    (`owned`) or (given `known`, the installed ServerArgs fields) not an SGLang arg at all."""
    for key in extra:
        where = f"{section}.{key}"
        if key in owned:
            raise ValueError(f"{where}: set by eyas (it depends on it or it has its own key)")
        if known is not None and key not in known:
            raise ValueError(f"{where}: not a ServerArgs field of the installed sglang")
    return dict(extra)


def base_engine_args(
    settings: SglangSettings, model_dir: str | os.PathLike, dtype: str, trust_remote_code: bool
) -> dict:
    """What every eyas engine of the target shares, from the config's `sglang` section."""
    args = {
        "model_path": os.fspath(model_dir),
        "tp_size": settings.tp_size,
        "mem_fraction_static": settings.mem_fraction_static,
        "chunked_prefill_size": settings.chunked_prefill_size,
        "skip_tokenizer_init": True,  # requests are token ids, outputs `output_ids`
        "dtype": dtype,
        "trust_remote_code": trust_remote_code,
        "random_seed": 0,
        "log_level": "warning",
    }
    if settings.attention_backend:
        args["attention_backend"] = settings.attention_backend
    return args


def spec_engine_args(
    base: dict, draft_dir: str | os.PathLike, ks: list[int], concurrency: int, workdir: str | os.PathLike
) -> dict:
    """EAGLE-3 chain drafting (top-k 1, k + 1 tokens a verify pass) at every k of `ks` in one engine,
    starting at the longest; at most `concurrency` requests at once. Writes the step-pinning policy
    into `workdir`."""
    if not ks or min(ks) < 1:
        raise ValueError(f"evaluate.num_draft_tokens: {ks} must be k >= 1")
    args = base | {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": os.fspath(draft_dir),
        # the longest chain first: sglang 0.5.17 sizes its shared logits buffer for the starting k
        "speculative_num_steps": max(ks),
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": max(ks) + 1,
    }
    if len(ks) > 1:
        policy = Path(workdir) / "eyas-pinned-steps.json"
        policy.write_text(json.dumps(pinned_steps_policy(ks)))
        args |= {"speculative_adaptive": True, "speculative_adaptive_config": os.fspath(policy)}
    return args | plain_engine_args({}, concurrency)


def pinned_steps_policy(ks: list[int]) -> dict:
    """SGLang's adaptive config: one batch-size slot (every batch routes to it) whose candidates are
    the k list and whose acceptance-driven updates never start; eyas pins the step itself."""
    return {"1": {"candidate_steps": sorted(ks), "warmup_batches": NEVER, "update_interval": NEVER}}


def plain_engine_args(base: dict, concurrency: int) -> dict:
    """The same engine without speculation (the reference), at most `concurrency` requests at once;
    no prefix cache, so a repeated prompt is prefilled again and runs are comparable."""
    return base | {
        "max_running_requests": concurrency,
        "cuda_graph_max_bs_decode": concurrency,  # graphs only for batch sizes that occur: faster start
        "disable_radix_cache": True,
    }


def generation_engine_args(base: dict, seed: int, settings=None) -> dict:
    """Regeneration: the engine schedules every prompt itself; the prefix cache stays on (turns of one
    conversation share their history). `settings` (`regenerate.engine`, RegenerateEngineSettings)
    sizes admission and CUDA graphs (sglang 0.5.17 `server_args.py`: `max_running_requests`,
    `cuda_graph_max_bs_decode`, `disable_prefill_cuda_graph`) and adds generation-only args."""
    args = base | {"random_seed": seed}
    if settings is None:
        return args
    if settings.max_running_requests is not None:
        args["max_running_requests"] = settings.max_running_requests
    if settings.cuda_graph_max_bs is not None:
        args["cuda_graph_max_bs_decode"] = settings.cuda_graph_max_bs
    if not settings.prefill_cuda_graph:
        args["disable_prefill_cuda_graph"] = True
    extra = user_engine_args(
        settings.engine_args, None, GENERATION_OWNED_ARGS, "regenerate.engine.engine_args"
    )
    return args | extra


def is_eagle3_draft_dir(path: str | os.PathLike) -> bool:
    config = Path(path) / "config.json"
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
        return any(arch in architectures for arch in EAGLE3_DRAFT_ARCHS)
    except (OSError, ValueError):
        return False


def installed_version() -> str:
    """The installed sglang's version (recorded in the results an engine made)."""
    import sglang

    return sglang.__version__


def server_arg_names() -> set[str]:
    """The installed release's ServerArgs fields (a dataclass up to 0.5.22, a msgspec Struct after)."""
    import inspect

    from sglang.srt.server_args import ServerArgs

    return set(inspect.signature(ServerArgs).parameters)


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


def in_stage_log(process_func, *args, **kwargs):
    """An engine process function (scheduler, detokenizer) run with its output in the stage's log
    file too (`eyas.core.logs.child_stage_logging`); picklable, as spawn needs, as a partial."""
    child_stage_logging()
    return process_func(*args, **kwargs)


def draft_swap_scheduler_process(*args, **kwargs):
    """`run_scheduler_process_func` of `DraftSwapEngine`: install the swap, then run SGLang's."""
    install_draft_swap()
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)


# --------------------------------------------------------------------------- in the job process
class EngineDied(RuntimeError):
    """An SGLang engine process (a scheduler, the detokenizer) died while a stage was using the engine."""


def _dead_processes(watchdog) -> str:
    """'scheduler_0 (pid 123, exit code -9)' for each engine process that exited with an error, read
    from SGLang's `SubprocessWatchdog` (its `_processes` and `_names`: `srt/utils/watchdog.py` of
    0.5.17 and 0.5.23), which watches every scheduler and detokenizer process of the engine."""
    procs = list(getattr(watchdog, "_processes", None) or [])
    names = list(getattr(watchdog, "_names", None) or [f"process_{i}" for i in range(len(procs))])
    dead = [
        f"{name} (pid {proc.pid}, exit code {proc.exitcode})"
        for proc, name in zip(procs, names, strict=False)
        if not proc.is_alive() and proc.exitcode != 0
    ]
    return ", ".join(dead) or "an engine process (its error is logged above)"


def death_message(stage: str, what: str) -> str:
    """The error of a stage whose engine died: `what` happened, what the job did, what to do."""
    return (
        f"{stage}: the SGLang engine died: {what} (eyas stopped the engine's other processes). The job "
        "stops here without writing its outputs. Rerun it: Snakemake reruns a job whose outputs are "
        "missing. If it dies again, the lines above say why (out of GPU memory, a crash in a kernel or "
        "in NCCL)."
    )


def _death_handler_class():
    """SGLang's SIGQUIT handler of a running engine, except that the job process lives on.

    When an engine process dies, SGLang's `SubprocessWatchdog` (a thread of the job process; sglang
    0.5.17 and 0.5.23 `srt/utils/watchdog.py`) sends SIGQUIT to the job process, and the tokenizer
    manager's `SignalHandler.running_phase_sigquit_handler` (`srt/managers/tokenizer_manager.py`) calls
    `kill_process_tree(os.getpid())`: it SIGKILLs the engine's processes and then the job process
    itself. A job killed so runs no `finally` and says nothing of why. Here the engine's processes are
    killed as SGLang kills them (GPU memory freed), the job process is spared, the engine is marked
    dead and its event loop stopped, so the engine call in flight fails and `EyasEngine` raises
    `EngineDied`, naming the stage and the process that died."""
    from sglang.srt.managers.tokenizer_manager import SignalHandler
    from sglang.srt.utils.common import kill_process_tree

    class EngineDeathHandler(SignalHandler):
        def __init__(self, tokenizer_manager, engine=None):
            super().__init__(tokenizer_manager)
            self.engine = engine

        def running_phase_sigquit_handler(self, signum=None, frame=None):
            manager = self.tokenizer_manager
            watchdog = manager._subprocess_watchdog
            dead = _dead_processes(watchdog)
            what = f"{dead} exited while the engine was in use (SGLang's watchdog noticed)"
            self.engine.died = death_message(self.engine.stage, what)
            log.error(self.engine.died)
            try:
                if watchdog is not None:
                    watchdog.stop()
                manager.dump_requests_before_crash()  # SGLang's crash dump, where one is configured
                kill_process_tree(os.getpid(), include_parent=False)
            finally:
                asyncio.get_running_loop().stop()  # the call waiting on the dead engine returns

    return EngineDeathHandler


async def _create_handle_loop(tokenizer_manager) -> None:
    tokenizer_manager.auto_create_handle_loop()


def _sigquit_while_starting(stage: str, signum=None, frame=None) -> None:
    """The engine's `custom_sigquit_handler` (a ServerArgs field SGLang installs instead of its
    start-up handler, which kills the job process: `_set_envs_and_config`, `entrypoints/engine.py` of
    0.5.17 and 0.5.23). An engine process that fails as the engine starts sends the job process
    SIGQUIT (`run_scheduler_process`'s `except`); this raises `EngineDied` from the start instead.
    Module-level (bound by `functools.partial`): spawn pickles the ServerArgs to the engine processes."""
    raise EngineDied(
        death_message(stage, "an engine process failed as the engine started (its error is above)")
    )


def engine_class():
    """`sglang.Engine` that raises `EngineDied` when one of its processes dies as it starts or later,
    during a call."""
    from sglang.srt.entrypoints.engine import Engine
    from sglang.srt.utils.common import kill_process_tree

    handler = _death_handler_class()

    class EyasEngine(Engine):
        def __init__(self, *, stage: str, loop=None, **kwargs):
            self.stage, self.died = stage, None
            # SGLang launches its processes with these (`Engine._launch_subprocesses`; a release
            # without one of them launches that process its own way, outside the stage's log).
            for name in ("run_scheduler_process_func", "run_detokenizer_process_func"):
                if hasattr(self, name):
                    setattr(self, name, functools.partial(in_stage_log, getattr(self, name)))
            quit_handler = functools.partial(_sigquit_while_starting, stage)
            try:
                super().__init__(**kwargs, custom_sigquit_handler=quit_handler)
            except EngineDied:
                kill_process_tree(os.getpid(), include_parent=False)
                raise
            except RuntimeError as err:
                # What SGLang raises when a scheduler dies before it is ready (`_wait_for_scheduler_ready`,
                # `entrypoints/engine.py` of 0.5.17 and 0.5.23); the engine's other processes would live
                # until the job exits (its atexit shutdown).
                kill_process_tree(os.getpid(), include_parent=False)
                raise EngineDied(death_message(stage, f"it did not start: {err}")) from err
            keep_stage_logging()  # SGLang's configure_logger reset the root logger as it started
            if loop is not None:
                # Several engines of one job share one event loop, so their calls can run together
                # (`eyas.engine.generation`): sglang 0.5.17 makes each engine a new loop, 0.5.23 reuses
                # the thread's (`Engine._ensure_event_loop`).
                self.loop = loop
                asyncio.set_event_loop(loop)
            manager = self.tokenizer_manager
            manager.signal_handler_class = functools.partial(handler, engine=self)
            # SGLang installs the tokenizer manager's SIGQUIT handler at its first request; until
            # then the start-up one is in place. Installed now, a death before the first request
            # (while the stage prepares its prompts) stops the next call too.
            self.loop.run_until_complete(_create_handle_loop(manager))

        def call(self, function, *args, **kwargs):
            """`function(*args, **kwargs)`, raising `EngineDied` when the engine is or becomes dead (a
            request to a dead scheduler would otherwise wait for ever)."""
            if self.died:
                raise EngineDied(self.died)
            try:
                return function(*args, **kwargs)
            except BaseException as err:
                if self.died:
                    raise EngineDied(self.died) from err
                raise

        def generate(self, *args, **kwargs):
            return self.call(super().generate, *args, **kwargs)

    return EyasEngine


def draft_swap_engine_class():
    """An `EyasEngine` whose scheduler processes accept `select` (drafter and k)."""

    class DraftSwapEngine(engine_class()):
        run_scheduler_process_func = staticmethod(draft_swap_scheduler_process)

        def select(self, draft_dir: str | os.PathLike, k: int) -> None:
            """Serve the drafter at `draft_dir` (weights loaded in place) drafting k tokens a pass."""
            from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

            path = os.fspath(draft_dir)
            if not is_eagle3_draft_dir(path):
                raise ValueError(f"{path}/config.json: not an EAGLE-3 drafter export {EAGLE3_DRAFT_ARCHS}")
            request = UpdateWeightFromDiskReqInput(model_path=path, weight_version=f"{STEPS_PREFIX}{k}")
            result = self.call(
                lambda: self.loop.run_until_complete(
                    self.tokenizer_manager.update_weights_from_disk(request, None)
                )
            )
            if not result[0]:
                raise RuntimeError(f"SGLang did not serve the drafter {path} at k={k}: {result[1]}")

    return DraftSwapEngine


def start_engine(args: dict, *, speculative: bool, stage: str, loop=None):
    """A running engine for `args` (checked against the installed ServerArgs first); `stage` names
    the job in the error raised when the engine dies; `loop`: the event loop it runs its calls on (by
    default its own)."""
    import sglang

    check_tested(sglang.__version__, "sglang engine")
    unknown = set(args) - server_arg_names()
    if unknown:
        raise ValueError(
            f"engine args {sorted(unknown)} are not ServerArgs fields of sglang {sglang.__version__}"
        )
    cls = draft_swap_engine_class() if speculative else engine_class()
    return cls(stage=stage, loop=loop, **args)
