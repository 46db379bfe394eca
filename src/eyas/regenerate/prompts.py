"""The prompts stage (rule `prompts`): conversations whose user turns the target writes itself.

Magpie (arXiv 2406.08464): an instruct model given its chat template up to the start of a user turn's
content writes a user's request, ending it with its end-of-turn token. Here each conversation is first
given a steer (`eyas.regenerate.mix`: language, tool use, topic, persona, task type) as the system
prompt it is written under; tool schemas go where training puts them (`eyas.data.tokenize`). With
`turns` > 1 the target then answers (from the conversation as written out, without the steer) and
writes a follow-up user turn from the conversation so far, and so on. The last user turn's answer is
not written here: the output feeds `prepare` (format `prompts`: the answer pending) and `regenerate`
writes it with its own settings (samples, temperature), like any other input's.

Every written user turn is checked (`eyas.regenerate.filters`, in order: empty, cut off, invalid text,
repetition loop, too long, wrong language, duplicate, near duplicate over the whole set); a failing
turn goes to the rejects file with its reason and ends its conversation there. Counts: conversations
== kept + rejected (rejected = its first user turn failed); turns_written == turns_kept +
turns_rejected; answers_written == answers_kept + answers_rejected (an empty answer, or one spelling
out a special token, ends its conversation before the next user turn). Sampling is seeded once
(`torch.manual_seed`) and every call runs in a fixed order, so the HF backend writes the same prompts
for the same seed.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter

import torch

from eyas.core.atomic import atomic_file
from eyas.data.formats import PROMPT_PLACEHOLDER, RecordRejected, normalize_record
from eyas.data.prepare import dumps_line, read_records
from eyas.data.tokenize import render_prompts, special_texts, user_turn_prefix
from eyas.regenerate.filters import DuplicateFilter, TurnLimits, check_turn, language
from eyas.regenerate.mix import Steer, plan
from eyas.regenerate.responses import HFGenerator, SglangGenerator

log = logging.getLogger("eyas.prompts")


def read_tool_sets(paths: list[str | os.PathLike]) -> dict[str, list[str]]:
    """{language: distinct tool-schema JSON texts} of the records of `paths` that have tools, the
    language being that of the record's first user turn; records that do not normalize are skipped."""
    sets: dict[str, list[str]] = {}
    seen = set()
    for path in paths:
        for raw in read_records(path):
            try:
                record = normalize_record(raw.record, raw.source)
            except RecordRejected:
                continue
            if record["tools"] is None or record["tools"] in seen:
                continue
            seen.add(record["tools"])
            first = next(m["content"] for m in record["messages"] if m["role"] == "user")
            sets.setdefault(language(first), []).append(record["tools"])
    return sets


class _Conversation:
    def __init__(self, key: str, steer: Steer):
        self.key, self.steer = key, steer
        self.messages: list[dict] = []
        self.done = False


def _write_answers(live, generate_answer, tokenizer, stats) -> None:
    """The target's answer to each live conversation's last user turn (as written out, no steer); an
    empty one, or one spelling out a special token, ends its conversation."""
    placeholder = {"role": "assistant", "content": PROMPT_PLACEHOLDER}
    prompts = render_prompts(tokenizer, [([*c.messages, placeholder], c.steer.tools) for c in live])
    specials = special_texts(tokenizer)
    for conversation, tokens in zip(live, generate_answer(prompts), strict=True):
        stats["answers_written"] += 1
        text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        if not text or any(s in text for s in specials):
            stats["answers_rejected"] += 1
            conversation.done = True
            continue
        stats["answers_kept"] += 1
        conversation.messages.append({"role": "assistant", "content": text})


def _write_user_turns(live, turn, generate_user, tokenizer, limits, duplicates, rejects, stats) -> None:
    """Each live conversation's next user turn; the first starts with the steer's opener, if any, which
    the target continues (the turn written out holds both)."""
    openers = [
        tokenizer.encode(c.steer.opener, add_special_tokens=False) if turn == 0 and c.steer.opener else []
        for c in live
    ]
    histories = [[{"role": "system", "content": c.steer.system}, *c.messages] for c in live]
    prompts = [
        user_turn_prefix(tokenizer, history, c.steer.tools) + opener
        for c, history, opener in zip(live, histories, openers, strict=True)
    ]
    for conversation, opener, tokens in zip(live, openers, generate_user(prompts), strict=True):
        stats["turns_written"] += 1
        stats["new_tokens"] += len(tokens)
        text = tokenizer.decode(opener + list(tokens), skip_special_tokens=True).strip()
        wanted = conversation.steer.language
        problem = check_turn(text, len(tokens), wanted, limits, given=len(opener)) or duplicates.check(text)
        if problem is not None:
            stats["turns_rejected"] += 1
            stats["by_reason"][problem[0]] += 1
            rejects.append(
                {
                    "id": conversation.key,
                    "turn": turn,
                    "reason": problem[0],
                    "detail": problem[1],
                    "text": text,
                    "steer": conversation.steer.summary(),
                }
            )
            conversation.done = True
            continue
        stats["turns_kept"] += 1
        duplicates.add(f"{conversation.key} turn {turn}", text)
        conversation.messages.append({"role": "user", "content": text})


def write_prompts(
    steers: list[Steer],
    generate_user,
    generate_answer,
    tokenizer,
    limits: TurnLimits,
    *,
    turns: int,
    seed: int,
) -> tuple[list[dict], list[dict], dict]:
    """(records, rejects, stats) of the conversations `steers` describe; `generate_user` writes user
    turns (its max_new_tokens must be `limits.max_new_tokens`), `generate_answer` the answers between
    them (a `HFGenerator` or `SglangGenerator` each)."""
    torch.manual_seed(seed)
    conversations = [_Conversation(f"target-{seed}-{i:07d}", s) for i, s in enumerate(steers)]
    duplicates = DuplicateFilter(limits.near_duplicate_jaccard, seed=seed)
    stats = Counter(turns_written=0, turns_kept=0, turns_rejected=0, new_tokens=0)
    stats |= Counter(answers_written=0, answers_kept=0, answers_rejected=0)
    stats["by_reason"] = Counter()
    rejects: list[dict] = []
    for turn in range(turns):
        if turn > 0:
            _write_answers([c for c in conversations if not c.done], generate_answer, tokenizer, stats)
        live = [c for c in conversations if not c.done]
        _write_user_turns(live, turn, generate_user, tokenizer, limits, duplicates, rejects, stats)
        log.info("prompts: user turn %d / %d written for %d conversations", turn + 1, turns, len(live))
    records = [
        {"id": c.key, "messages": c.messages, "tools": c.steer.tools, "steer": c.steer.summary()}
        for c in conversations
        if c.messages
    ]
    stats = _summary(stats, len(conversations), records)
    assert stats["conversations"] == stats["kept"] + stats["rejected"], stats
    assert stats["turns_written"] == stats["turns_kept"] + stats["turns_rejected"], stats
    assert stats["answers_written"] == stats["answers_kept"] + stats["answers_rejected"], stats
    return records, rejects, stats


def _summary(stats: Counter, written: int, records: list[dict]) -> dict:
    kept = len(records)
    mix = Counter(r["steer"]["language"] for r in records)
    return {
        "conversations": written,
        "kept": kept,
        "rejected": written - kept,
        **{k: stats[k] for k in ("turns_written", "turns_kept", "turns_rejected")},
        "by_reason": dict(sorted(stats["by_reason"].items())),
        **{k: stats[k] for k in ("answers_written", "answers_kept", "answers_rejected", "new_tokens")},
        "kept_mix": {
            "zh": mix["zh"] / kept if kept else 0.0,
            "tools": sum(r["tools"] is not None for r in records) / kept if kept else 0.0,
            "user_turns_per_conversation": stats["turns_kept"] / kept if kept else 0.0,
        },
    }


def _outputs(records, rejects, stats, out_prompts, out_rejects, out_stats) -> None:
    for path, rows in ((out_prompts, records), (out_rejects, rejects)):
        with atomic_file(path) as fh:
            for row in rows:
                fh.write(dumps_line(row))
    with atomic_file(out_stats) as fh:
        json.dump(stats, fh, indent=2, ensure_ascii=False)
        fh.write("\n")


def run_prompts(
    out_prompts: str | os.PathLike,
    out_rejects: str | os.PathLike,
    out_stats: str | os.PathLike,
    model_dir: str | os.PathLike,
    tool_files: list[str | os.PathLike],
    *,
    settings,
    answer_settings,
    engine_settings,
    trust_remote_code: bool = False,
) -> dict:
    """The prompts stage: `settings` (PromptSettings) writes the user turns, `answer_settings`
    (RegenerateSettings: max_new_tokens, temperature) the answers between them, `engine_settings`
    (the `sglang` section) configures the SGLang engines of backend sglang, which
    `answer_settings.engine` (`regenerate.engine`: admission, CUDA graphs, how many engines and how
    they start) sizes as it sizes regeneration's. Returns the stats."""
    from eyas.model.target import load_target, load_tokenizer, resolve_device

    tokenizer = load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
    tool_sets = read_tool_sets(tool_files) if settings.tool_share > 0 else {}
    steers = plan(
        settings.conversations,
        seed=settings.seed,
        chinese_share=settings.chinese_share,
        tool_share=settings.tool_share,
        tool_sets=tool_sets,
        opener_share=settings.opener_share,
    )
    limits = TurnLimits(
        settings.max_new_tokens,
        settings.max_tokens,
        settings.near_duplicate_jaccard,
        special_texts(tokenizer),
    )
    user = dict(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)
    answer = dict(max_new_tokens=answer_settings.max_new_tokens, temperature=answer_settings.temperature)
    run = dict(turns=settings.turns, seed=settings.seed)
    if settings.backend == "sglang":
        from eyas.engine.generation import generation_engines

        engines = generation_engines(
            engine_settings, answer_settings.engine, model_dir=model_dir, seed=settings.seed,
            trust_remote_code=trust_remote_code, stage=f"prompts {os.fspath(out_prompts)}",
        )  # fmt: skip
        with engines:
            eos = {tokenizer.eos_token_id}
            generators = (SglangGenerator(engines, eos_token_ids=eos, **kw) for kw in (user, answer))
            result = write_prompts(steers, *generators, tokenizer, limits, **run)
    else:
        model = load_target(
            model_dir, device=resolve_device(settings.device), trust_remote_code=trust_remote_code
        )
        generators = (
            HFGenerator(model, tokenizer, batch_size=settings.batch_size, **kw) for kw in (user, answer)
        )
        result = write_prompts(steers, *generators, tokenizer, limits, **run)
    _outputs(*result, out_prompts, out_rejects, out_stats)
    return result[2]
