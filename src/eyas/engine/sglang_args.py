"""The arguments of every SGLang engine eyas builds, and the checks of the installed release.

Pure: the builders run anywhere; only `installed_version` and `server_arg_names` import sglang, lazily.
One function builds the arguments every engine shares (`base_engine_args`: the target, TP, memory,
attention backend, the user's `engine_args`, all from the config's one `sglang` section); each use adds
its own:

- served evaluation: EAGLE-3 chain drafting of k tokens, i.e. `speculative_num_steps=k,
  speculative_eagle_topk=1, speculative_num_draft_tokens=k+1` (SGLang's own benchmark settings,
  e.g. `benchmark/` and the EAGLE-3 section of docs/advanced_features/speculative_decoding.md), and
  a plain engine with the same settings as the reference; with several k, the candidates of SGLang's
  adaptive speculative decoding under a policy that never moves on its own (`pinned_steps_policy`;
  `eyas.engine.sglang_draft_swap` pins the k measured);
- regeneration: a plain engine that samples;
- extraction: the capture engine (`eyas.extract.sglang_backend.engine_args`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eyas.config import SglangSettings

TESTED = ((0, 5, 17), (0, 5, 23))  # inclusive range of releases eyas was built and tested against
NEVER = 2**62  # the adaptive policy's warm-up, in verify batches: it never adapts by itself
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


def installed_version() -> str:
    """The installed sglang's version (recorded in the results an engine made)."""
    import sglang

    return sglang.__version__


def server_arg_names() -> set[str]:
    """The installed release's ServerArgs fields (a dataclass up to 0.5.22, a msgspec Struct after)."""
    import inspect

    from sglang.srt.server_args import ServerArgs

    return set(inspect.signature(ServerArgs).parameters)
