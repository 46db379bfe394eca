"""Regenerate assistant responses with the target itself (optional stage between prepare and tokenize).

A drafter learns to predict the target; training on the target's own responses instead of the
dataset's removes the mismatch between what the data says and what the target would say (the
EAGLE/SpecForge "regenerate" recipe). `turns: last` replaces each conversation's LAST assistant turn by
the target's continuation of the history before it (chat template with the generation prompt), the
earlier turns kept; `turns: all` regenerates every assistant turn in order, each from the history
with the earlier turns already regenerated (user and tool turns stay as they were: a regenerated tool
call is still followed by the dataset's tool result). `samples: n` > 1 (sampling) gives n responses
per conversation, each written as its own conversation (`id#s<j>`).

Two generators: `HFGenerator` (prompts sorted by length, left-padded, batched `generate` with a KV
cache) and `SglangGenerator` (every prompt of a round handed to the job's SGLang engines,
`eyas.engine.generation`, which schedule them). One job regenerates every split: each turn round is one
generate call over all splits, so the engines start once and see the whole queue. With SGLang and
`regenerate.engine.pipeline_turns` there are no rounds (`regenerate_pipelined`): each conversation
sample's next turn goes to the engines as soon as its last one is back. With SGLang the splits are
read and their first prompts rendered (once per conversation, shared by its samples) while the
engines start.

Counts, per conversation: read == regenerated + empty (every sample empty at its first turn) +
too_long (first prompt over the limit) + no_assistant (tokenize rejects these); those not regenerated
are written back unchanged. A later turn whose prompt grows too long, or whose response is empty,
keeps the dataset's text and is counted in `turns_kept`. A response cut at max_new_tokens is kept.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from eyas.config import RegenerateSettings, SglangSettings
from eyas.core.atomic import atomic_file
from eyas.core.logs import Progress, heartbeat
from eyas.data.formats import sample_id
from eyas.data.tokenize import SampleRejected, read_prepared, render_prompt, render_prompts

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("eyas.regenerate")


def _batches(order: list[int], batch_size: int) -> list[list[int]]:
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float,
):
    """Continuations (token lists, through the first eos exclusive) of left-padded `prompts`."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)  # [B, T] left-padded
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, T]
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        top_k=None,
        top_p=None,
        **sampling,
    )  # [B, T + N]
    results = []
    for row in out[:, width:].tolist():
        cut = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
        results.append(row[:cut])
    return results


class HFGenerator:
    """Batched Hugging Face generation: prompts sorted by length, `batch_size` at a time."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int,
        max_new_tokens: int,
        temperature: float,
    ):
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(f"batch_size={batch_size} and max_new_tokens={max_new_tokens} must be >= 1")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_new_tokens, self.temperature = batch_size, max_new_tokens, temperature

    def __call__(self, prompts: list[list[int]]) -> list[list[int]]:
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[list[int]] = [[] for _ in prompts]
        batches = _batches(order, self.batch_size)
        lines = Progress(log, "regenerate", len(prompts), "prompts")
        for batch in tqdm(batches, desc="regenerate", unit="batch", disable=len(batches) < 2):
            outputs = generate_batch(
                self.model,
                self.tokenizer,
                [prompts[i] for i in batch],
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
            )
            for i, tokens in zip(batch, outputs, strict=True):
                results[i] = tokens
            lines.update(len(batch))
        return results


class SglangGenerator:
    """Every prompt of a call handed at once to a running SGLang engine, or to the job's generation
    engines (`eyas.engine.generation.GenerationEngines`), which batch them themselves."""

    def __init__(self, engine, *, eos_token_ids: set[int], max_new_tokens: int, temperature: float):
        self.engine, self.eos = engine, set(eos_token_ids)
        self.sampling = {"temperature": temperature, "max_new_tokens": max_new_tokens}

    def __call__(self, prompts: list[list[int]]) -> list[list[int]]:
        if not prompts:
            return []
        # One call holds every prompt (the engine batches them itself): a heartbeat shows it is alive.
        with heartbeat(log, f"regenerate: {len(prompts)} prompts in the engine"):
            outputs = self.engine.generate(input_ids=prompts, sampling_params=self.sampling)
        return [_cut_at_eos(out["output_ids"], self.eos) for out in outputs]


def _cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[:i])
    return list(tokens)


def _assistant_turns(messages: list[dict], turns: str) -> list[int]:
    positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return positions if turns == "all" else positions[-1:]


def _has_turn(stream, round_index) -> bool:
    return not stream["done"] and round_index < len(stream["turns"])


def _history(state, stream, round_index) -> tuple[list[dict], str | None]:
    """(messages, tools) to render the prompt of `stream`'s turn `round_index` > 0 from."""
    return stream["messages"][: stream["turns"][round_index] + 1], state["records"][stream["record"]]["tools"]


def _fits(state, stream, round_index, ids, max_prompt_length) -> bool:
    """Whether the prompt fits; one over the limit ends its stream, its remaining turns kept."""
    if len(ids) <= max_prompt_length:
        return True
    stream["done"] = True
    state["stats"]["turns_kept"] += len(stream["turns"]) - round_index
    return False


def _turn_prompt(state, stream, round_index, tokenizer, max_prompt_length) -> list[int] | None:
    """The prompt of `stream`'s turn `round_index`, or None where the stream has no such turn left (it
    ended, or this prompt is over the limit)."""
    if not _has_turn(stream, round_index):
        return None
    if round_index == 0:
        ids = stream["first"]  # rendered once per conversation, shared by its samples
    else:
        ids = render_prompt(tokenizer, *_history(state, stream, round_index))
    return ids if _fits(state, stream, round_index, ids, max_prompt_length) else None


def _round_prompts(states, round_index, tokenizer, max_prompt_length) -> list[tuple[dict, dict, list[int]]]:
    """(state, stream, prompt) of every stream with a turn `round_index` that fits, as `_turn_prompt`
    gives them one at a time, the round's histories tokenized in one call (`render_prompts`)."""
    live = [(st, stream) for st in states for stream in st["streams"] if _has_turn(stream, round_index)]
    if round_index == 0:
        prompts = [stream["first"] for _, stream in live]
    else:
        prompts = render_prompts(tokenizer, [_history(state, stream, round_index) for state, stream in live])
    return [
        (state, stream, ids)
        for (state, stream), ids in zip(live, prompts, strict=True)
        if _fits(state, stream, round_index, ids, max_prompt_length)
    ]


def _take_turn(state, stream, round_index, tokens: list[int], tokenizer) -> None:
    """`tokens` (cut at end-of-turn) become `stream`'s assistant turn `round_index`; an empty response
    ends the stream, its remaining turns kept."""
    stats = state["stats"]
    text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    if not text:
        stream["done"] = True
        stats["turns_kept"] += len(stream["turns"]) - round_index
        return
    stream["messages"][stream["turns"][round_index]] = {"role": "assistant", "content": text}
    stream["regenerated_turns"] += 1
    stats["turns_regenerated"] += 1
    stats["new_tokens"] += len(tokens)


def _stream_round(
    states, round_index, tokenizer: PreTrainedTokenizerBase, generate, max_prompt_length
) -> None:
    """Regenerate turn `round_index` of every live stream of every split (one generate call)."""
    todo = _round_prompts(states, round_index, tokenizer, max_prompt_length)
    for (state, stream, _), tokens in zip(todo, generate([ids for _, _, ids in todo]), strict=True):
        _take_turn(state, stream, round_index, tokens, tokenizer)


def regenerate_pipelined(
    states: list[dict],
    engines,
    tokenizer: PreTrainedTokenizerBase,
    *,
    sampling: dict,
    eos_token_ids: set[int],
    max_prompt_length: int,
) -> None:
    """Every stream's turns in order, each stream on its own: its next turn goes to the engines as soon
    as its last one is back, instead of waiting for the whole round (a round ends with its slowest
    response, and the later rounds of a few multi-turn conversations leave the engines nearly idle).
    Same turns, prompts and counts as `regenerate_rounds`; `engines` is the job's
    `eyas.engine.generation.GenerationEngines` (stream n on engine n mod count)."""
    turns = 0

    async def stream_turns(number: int, state: dict, stream: dict) -> None:
        nonlocal turns
        for round_index in range(len(stream["turns"])):
            ids = _turn_prompt(state, stream, round_index, tokenizer, max_prompt_length)
            if ids is None:
                return
            out = await engines.generate_one(number, input_ids=ids, sampling_params=sampling)
            _take_turn(state, stream, round_index, _cut_at_eos(out["output_ids"], eos_token_ids), tokenizer)
            turns += 1

    streams = [(state, stream) for state in states for stream in state["streams"]]
    chains = [stream_turns(n, state, stream) for n, (state, stream) in enumerate(streams)]
    with heartbeat(log, f"regenerate: {len(streams)} streams' turns in the engines, pipelined"):
        engines.run(_gather(chains))
    log.info("regenerate: %d turns generated, pipelined over %d streams", turns, len(streams))


async def _gather(chains) -> list:
    return await asyncio.gather(*chains)


def prepare_split(
    conversations: str | os.PathLike,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_prompt_length: int,
    samples: int,
    turns: str,
) -> dict:
    """A split read and its streams set up (one per conversation and sample, the first prompt rendered
    once per conversation): the state `regenerate_rounds` advances and `write_split` writes."""
    if turns not in ("last", "all") or samples < 1:
        raise ValueError(f"turns={turns!r} must be last or all, samples={samples} must be >= 1")
    records = list(read_prepared(conversations))
    stats = {"read": len(records), "regenerated": 0, "empty": 0, "too_long": 0, "no_assistant": 0}
    stats |= {"turns_regenerated": 0, "turns_kept": 0, "samples_written": 0, "new_tokens": 0}
    streams = []
    for index, record in enumerate(records):
        try:
            first = render_prompt(tokenizer, record["messages"], record["tools"]) if turns == "last" else None
        except SampleRejected:
            stats["no_assistant"] += 1  # tokenize rejects it with its reason; nothing to regenerate
            continue
        positions = _assistant_turns(record["messages"], turns)
        if turns == "all":
            first = render_prompt(tokenizer, record["messages"][: positions[0] + 1], record["tools"])
        if len(first) > max_prompt_length:
            stats["too_long"] += 1
            continue
        for sample in range(samples):
            streams.append(
                {"record": index, "sample": sample, "messages": [dict(m) for m in record["messages"]],
                 "turns": positions, "first": first, "done": False, "regenerated_turns": 0}
            )  # fmt: skip
    return {"records": records, "streams": streams, "stats": stats, "samples": samples}


def regenerate_rounds(
    states: list[dict], generate, tokenizer: PreTrainedTokenizerBase, *, max_prompt_length: int
) -> None:
    """Every turn round of every split's streams, one `generate` call a round over all splits."""
    rounds = max((len(s["turns"]) for state in states for s in state["streams"]), default=0)
    for round_index in range(rounds):
        _stream_round(states, round_index, tokenizer, generate, max_prompt_length)
        log.info("regenerate: turn round %d / %d done", round_index + 1, rounds)


def write_split(state: dict, out_path: str | os.PathLike) -> dict:
    """Write a split's conversations (regenerated samples, or the record unchanged) atomically; returns
    its counts."""
    records, stats, samples = state["records"], state["stats"], state["samples"]
    by_record: dict[int, list[dict]] = {}
    for stream in state["streams"]:
        by_record.setdefault(stream["record"], []).append(stream)
    with atomic_file(out_path) as fh:
        for index, record in enumerate(records):
            kept = [s for s in by_record.get(index, []) if s["regenerated_turns"] > 0]
            if index in by_record:
                stats["regenerated" if kept else "empty"] += 1
            if not kept:
                fh.write(json.dumps(record | {"regenerated": False}, ensure_ascii=False) + "\n")
                continue
            for stream in kept:
                out = record | {
                    "id": sample_id(record["id"], stream["sample"]) if samples > 1 else record["id"],
                    "messages": stream["messages"],
                    "regenerated": True,
                }
                fh.write(json.dumps(out, ensure_ascii=False) + "\n")
                stats["samples_written"] += 1
    return stats


def regenerate_split(
    conversations: str | os.PathLike,
    out_path: str | os.PathLike,
    generate,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_prompt_length: int,
    samples: int = 1,
    turns: str = "last",
    seed: int = 0,
) -> dict:
    """Write `conversations` with assistant turns regenerated by `generate` (a `HFGenerator` or
    `SglangGenerator`) to `out_path`; returns the counts."""
    torch.manual_seed(seed)
    state = prepare_split(
        conversations, tokenizer, max_prompt_length=max_prompt_length, samples=samples, turns=turns
    )
    regenerate_rounds([state], generate, tokenizer, max_prompt_length=max_prompt_length)
    return write_split(state, out_path)


def run_regenerate(
    splits: list[tuple[str | os.PathLike, str | os.PathLike, str | os.PathLike]],
    model_dir: str | os.PathLike,
    *,
    settings: RegenerateSettings,
    engine_settings: SglangSettings,
    max_length: int,
    trust_remote_code: bool = False,
) -> list[dict]:
    """The regenerate stage (rule regenerate): every split `(conversations, out_conversations,
    out_stats)` of the job through one generator, one generate call a turn round over all splits.
    `settings` (RegenerateSettings) picks the backend and, for `sglang`, the generation engines
    (`settings.engine`); `engine_settings` (the `sglang` section) holds the shared engine keys. With
    SGLang the splits are read and their first prompts rendered while the engines start. Outputs are
    written atomically once every response is in; an engine that dies first raises `EngineDied` and no
    output is written. Returns each split's counts."""
    from eyas.model.target import load_target, load_tokenizer, resolve_device

    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    # the regenerated sample must still fit tokenize's max_length
    limit = max_length - settings.max_new_tokens
    shape = dict(max_prompt_length=limit, samples=settings.samples, turns=settings.turns)
    sampling = dict(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    if settings.backend == "sglang":
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="eyas-prepare") as pool:
            prepared = pool.submit(lambda: [prepare_split(src, tokenizer, **shape) for src, _, _ in splits])
            engines = _generation_engines(settings, engine_settings, model_dir, trust_remote_code, splits)
            with engines:
                states = prepared.result()
                eos = {tokenizer.eos_token_id}
                if settings.engine.pipeline_turns:
                    pipelined = dict(sampling=sampling, eos_token_ids=eos, max_prompt_length=limit)
                    regenerate_pipelined(states, engines, tokenizer, **pipelined)
                else:
                    generate = SglangGenerator(engines, eos_token_ids=eos, **sampling)
                    regenerate_rounds(states, generate, tokenizer, max_prompt_length=limit)
    else:
        torch.manual_seed(settings.seed)
        device = resolve_device(settings.device)
        model = load_target(model_dir, device=device, trust_remote_code=trust_remote_code)
        generate = HFGenerator(model, tokenizer, batch_size=settings.batch_size, **sampling)
        states = [prepare_split(src, tokenizer, **shape) for src, _, _ in splits]
        regenerate_rounds(states, generate, tokenizer, max_prompt_length=limit)
    results = []
    for state, (_, out_conversations, out_stats) in zip(states, splits, strict=True):
        stats = write_split(state, out_conversations)
        with atomic_file(out_stats) as fh:
            json.dump(stats, fh, indent=2)
        results.append(stats)
    return results


def _generation_engines(settings, engine_settings, model_dir, trust_remote_code, splits):
    """The job's SGLang generation engines (`regenerate.engine`), named after the job's outputs."""
    from eyas.engine.generation import generation_engines

    stage = "regenerate " + ", ".join(os.fspath(out) for _, out, _ in splits)
    return generation_engines(
        engine_settings, settings.engine, model_dir=model_dir, seed=settings.seed,
        trust_remote_code=trust_remote_code, stage=stage,
    )  # fmt: skip
