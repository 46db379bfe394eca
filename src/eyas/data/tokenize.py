"""The tokenize stage: prepared conversations -> token shards with an exact assistant loss mask.

Loss mask, per sample: the whole conversation is rendered with the target's chat template and
tokenized once (`add_special_tokens=False`: the template writes any BOS itself). For assistant turn
`i`, `messages[:i]` rendered with the generation prompt (P) and `messages[:i+1]` (Q) must tokenize to
prefixes of the full sequence (else `template_not_prefix_stable`: a template that rewrites history,
or a token merge across the turn boundary, would make any mask a guess). The mask is 1 on tokens
`[len(P), first end-of-turn]`, both included: the assistant's text plus the end-of-turn token (the
tokenizer's eos, `<|im_end|>` for ChatML) that the drafter must learn to emit. Template whitespace after
that token is not assistant output. Tokens are compared, never text.

Tools: when a record has tools and the template reads a `tools` variable, the schemas are passed as
`apply_chat_template(tools=...)`. Otherwise (e.g. SmolLM2's ChatML) their JSON text is added to the
system message as `TOOLS_SYSTEM_PREFIX + tools`, after a blank line if a system message exists, or as a
new first system message (which then replaces a template's default system prompt).

Message content holding a special token's text (e.g. a literal `<|im_end|>`) is rejected: it would
tokenize to the control token, cut the mask short and fake a turn boundary.

Sharding: samples go longest first (ties: input order) to the shard with the fewest tokens (ties:
lowest index); each shard keeps its samples in input order. This greedy order (LPT) keeps the shards
within one sample's length of each other.
"""

from __future__ import annotations

import functools
import heapq
import json
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
import jinja2.meta
import numpy as np

from eyas.core.atomic import atomic_file
from eyas.core.provenance import EYAS_VERSION, chat_template_hash, tokenizer_hash
from eyas.data.formats import PROMPT_PLACEHOLDER, ROLES
from eyas.data.prepare import dumps_line, truncate_record
from eyas.model.target import load_tokenizer
from eyas.store import write_token_shard

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TOOLS_SYSTEM_PREFIX = "You have access to the following functions (JSON schemas):\n"

TOKENIZE_REJECT_REASONS: dict[str, str] = {
    "too_long": "more than max_length tokens",
    "no_loss_tokens": "no token is masked for the loss (no assistant turn)",
    "template_not_prefix_stable": "a prefix of the conversation does not tokenize to a prefix of the whole",
    "no_end_of_turn": "an assistant turn has no end-of-turn (eos) token",
    "special_token_in_content": "message or tools text contains a special token's text",
    "template_error": "the chat template raised an error on this conversation",
    "not_generated": "a target-written prompt whose answer the regenerate stage did not write",
}


class SampleRejected(ValueError):
    """A conversation cannot become a training sample; `reason` is a key of TOKENIZE_REJECT_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@functools.lru_cache(maxsize=8)
def _template_reads_tools(template: str) -> bool:
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        return "tools" in template  # HF extensions (e.g. {% generation %}) we cannot parse: be textual
    return "tools" in jinja2.meta.find_undeclared_variables(ast)


def special_texts(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    specials = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return tuple(sorted(specials | set(tokenizer.all_special_tokens)))


def _check_no_special_tokens(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: str | None
) -> None:
    texts = [(f"turn {i} ({m['role']})", m["content"]) for i, m in enumerate(messages)]
    texts += [("tools", tools)] if tools else []
    for special in special_texts(tokenizer):
        for where, text in texts:
            if special in text:
                raise SampleRejected("special_token_in_content", f"{where} contains {special!r}")


def _apply_tools(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: str | None
) -> tuple[list[dict], list | None]:
    """(messages, `tools=` argument): schemas go to the template if it reads them, else into system."""
    if not tools:
        return messages, None
    schemas = json.loads(tools)
    if _template_reads_tools(tokenizer.get_chat_template(tools=schemas)):
        return messages, schemas
    block = TOOLS_SYSTEM_PREFIX + tools
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + block}, *messages[1:]], None
    return [{"role": "system", "content": block}, *messages], None


def _render_text(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list | None, generation_prompt: bool
) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
    except jinja2.TemplateError as err:  # templates reject conversations with raise_exception(...)
        raise SampleRejected("template_error", f"{type(err).__name__}: {err}") from None


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list | None, generation_prompt: bool
) -> list[int]:
    text = _render_text(tokenizer, messages, tools, generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_sample(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    tools: str | None,
    *,
    max_length: int | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one conversation; raises `SampleRejected`.

    `max_length` (optional) rejects a too-long sample before the per-turn renders are paid for.
    """
    eot = tokenizer.eos_token_id
    if eot is None:
        raise ValueError("tokenizer has no eos token: the end of an assistant turn cannot be found")
    _check_no_special_tokens(tokenizer, messages, tools)
    messages, tool_arg = _apply_tools(tokenizer, messages, tools)
    ids = _render(tokenizer, messages, tool_arg, generation_prompt=False)
    if max_length is not None and len(ids) > max_length:
        raise SampleRejected("too_long", f"{len(ids)} tokens > max_length {max_length}")
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], tool_arg, generation_prompt=True)  # P
        turn = _render(tokenizer, messages[: i + 1], tool_arg, generation_prompt=False)  # Q
        for name, part in ((f"messages[:{i}] + generation prompt", prompt), (f"messages[:{i + 1}]", turn)):
            if ids[: len(part)] != part:
                raise SampleRejected(
                    "template_not_prefix_stable", f"tokens of {name} are not a prefix of the conversation's"
                )
        try:
            end = turn.index(eot, len(prompt))
        except ValueError:
            raise SampleRejected(
                "no_end_of_turn", f"assistant turn {i} has no {tokenizer.eos_token!r} (eos) token"
            ) from None
        mask[len(prompt) : end + 1] = [1] * (end + 1 - len(prompt))
    if not any(mask):
        raise SampleRejected("no_loss_tokens", f"{len(ids)} tokens, none in an assistant turn")
    return ids, mask


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: str | None) -> list[int]:
    """Tokens of the conversation before its last assistant turn, plus the generation prompt."""
    return render_prompts(tokenizer, [(messages, tools)])[0]


def render_prompts(
    tokenizer: PreTrainedTokenizerBase, conversations: Sequence[tuple[list[dict], str | None]]
) -> list[list[int]]:
    """`render_prompt` of each `(messages, tools)`, the texts tokenized in one call: a fast tokenizer
    encodes a batch on all cores (the demo prompts' later turn rounds hold ~4,400 tool-use histories,
    1.2 ms each one at a time on 2 cores). The first conversation that cannot be rendered raises its
    `SampleRejected`."""
    texts = [_prompt_text(tokenizer, messages, tools) for messages, tools in conversations]
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def _prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: str | None) -> str:
    _check_no_special_tokens(tokenizer, messages, tools)
    messages, tool_arg = _apply_tools(tokenizer, messages, tools)
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise SampleRejected("no_loss_tokens", "conversation has no assistant turn")
    return _render_text(tokenizer, messages[:last], tool_arg, generation_prompt=True)


_USER_CONTENT_MARK = "\x00eyas-user-content\x00"  # no template writes this; it marks where the content goes


def user_turn_prefix(tokenizer, messages: list[dict], tools: str | None) -> list[int]:
    """Tokens of `messages` followed by a new user turn cut where its content starts: from there the
    target writes a user's words itself (Magpie, arXiv 2406.08464). Tools are placed as for training."""
    _check_no_special_tokens(tokenizer, messages, tools)
    messages, tool_arg = _apply_tools(tokenizer, messages, tools)
    turn = {"role": "user", "content": _USER_CONTENT_MARK}
    try:
        text = tokenizer.apply_chat_template([*messages, turn], tools=tool_arg, tokenize=False)
    except jinja2.TemplateError as err:
        raise SampleRejected("template_error", f"{type(err).__name__}: {err}") from None
    if text.count(_USER_CONTENT_MARK) != 1:
        raise ValueError("the chat template does not write a user turn's content once, verbatim")
    return tokenizer(text[: text.index(_USER_CONTENT_MARK)], add_special_tokens=False)["input_ids"]


def check_generated(record: dict) -> None:
    """A conversation prepare marked `pending` (its last answer to be written by the target) must have
    had that answer written by regenerate; its placeholder is never trained on."""
    last = [m for m in record["messages"] if m["role"] == "assistant"][-1:]
    if record.get("pending") and last and last[0]["content"] == PROMPT_PLACEHOLDER:
        raise SampleRejected("not_generated", "regenerate did not write this prompt's answer")


def assign_shards(lengths: list[int], num_shards: int) -> list[list[int]]:
    """Sample indices per shard, balanced by tokens (longest first to the lightest shard)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    heap = [(0, shard) for shard in range(num_shards)]  # (tokens so far, shard index): ties -> low index
    members: list[list[int]] = [[] for _ in range(num_shards)]
    for index in sorted(range(len(lengths)), key=lambda n: (-lengths[n], n)):
        tokens, shard = heapq.heappop(heap)
        members[shard].append(index)
        heapq.heappush(heap, (tokens + lengths[index], shard))
    return [sorted(m) for m in members]


def read_prepared(path: str | os.PathLike) -> Iterator[dict]:
    """Records of a prepared split; a malformed line is a hard error (prepare wrote this file)."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: invalid JSON at column {err.colno}: {err.msg}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: record is not an object")
            for field, kinds in (("id", str), ("messages", list), ("tools", (str, type(None)))):
                if not isinstance(record.get(field, ...), kinds):
                    raise ValueError(f"{where}: field {field!r} is missing or has the wrong type")
            for i, m in enumerate(record["messages"]):
                if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
                    raise ValueError(
                        f"{where}: field 'messages[{i}]' needs a role in {ROLES} and str content"
                    )
            record.setdefault("source", where)
            yield record


@dataclass
class _Tokenized:
    """One split's records as samples, (input_ids int32, loss_mask uint8) beside their ids, or rejects."""

    read: int = 0
    samples: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    sample_ids: list[str] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    by_reason: Counter[str] = field(default_factory=Counter)


RECORDS_PER_TASK = 64  # records a worker builds per task: spread evenly, the pickling amortized
# Below this size a split is built in the job's own process: each worker's start (torch's import, the
# tokenizer: ~3 s and ~380 MB on a 2-core VM) eats the gain. At 3.9 MiB (0.87M tokens) two workers
# gained 1.07x there, at 15.7 MiB 1.56x (bench/results/tokenize-cpu-4mib.json, tokenize-cpu.json).
PARALLEL_MIN_BYTES = 4 << 20
_WORKER: dict = {}  # the tokenizer and max_length of this process (a worker's, or the job's own)


def _start_worker(tokenizer_dir: str, trust_remote_code: bool, max_length: int) -> None:
    _WORKER.update(tokenizer=load_tokenizer(tokenizer_dir, trust_remote_code), max_length=max_length)


def _build_record(record: dict) -> tuple[str, tuple[np.ndarray, np.ndarray] | None, dict | None]:
    """(id, sample, None) for a record built into a sample (`build_sample`), or (id, None, its reject
    row); runs in a worker process or in the job's own."""
    try:
        check_generated(record)
        ids, mask = build_sample(
            _WORKER["tokenizer"], record["messages"], record["tools"], max_length=_WORKER["max_length"]
        )
    except SampleRejected as err:
        reject = {"source": record["source"], "id": record["id"], "reason": err.reason,
                  "detail": err.detail, "record": truncate_record(record)}  # fmt: skip
        return record["id"], None, reject
    return record["id"], (np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)), None


Builder = Callable[[Iterable[dict]], Iterator[tuple]]


@contextmanager
def _builder(
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_dir: str,
    trust_remote_code: bool,
    max_length: int,
    workers: int,
) -> Iterator[Builder]:
    """Builds records in order: in this process (with `tokenizer`), or on `workers` processes
    (spawned: a fork of a process that loaded torch's thread pools can hang; the rule's script keeps
    a main guard for it). The chat template renders in Python, so processes, not threads, divide the
    time."""
    if workers <= 1:
        _WORKER.update(tokenizer=tokenizer, max_length=max_length)
        yield lambda records: map(_build_record, records)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, _start_worker, (tokenizer_dir, trust_remote_code, max_length)) as pool:
        yield lambda records: pool.imap(_build_record, records, chunksize=RECORDS_PER_TASK)


def _tokenize_records(conversations: str, build: Builder) -> _Tokenized:
    """Every record of a prepared split built into a sample or rejected with its reason, in file
    order; a split whose records are all rejected is an error."""
    done = _Tokenized()
    for sample_id, sample, reject in build(read_prepared(conversations)):
        done.read += 1
        if reject is not None:
            done.by_reason[reject["reason"]] += 1
            done.rejects.append(reject)
            continue
        done.samples.append(sample)
        done.sample_ids.append(sample_id)
    if done.read and not done.samples:  # empty shards would only fail later, in extraction or training
        first, reasons = done.rejects[0], dict(sorted(done.by_reason.items()))
        raise ValueError(
            f"{conversations}: all {done.read} conversations rejected ({reasons}); "
            f"first: id {first['id']!r}: {first['reason']}: {first['detail']}"
        )
    return done


def _write_shards(out_shards: list[str], tokenized: _Tokenized, attrs: dict) -> list[dict]:
    """The samples written into `len(out_shards)` token-balanced shards (`assign_shards`); returns the
    samples, tokens and loss tokens of each shard."""
    samples, lengths = tokenized.samples, [len(ids) for ids, _ in tokenized.samples]
    shard_stats = []
    for shard, (path, members) in enumerate(
        zip(out_shards, assign_shards(lengths, len(out_shards)), strict=True)
    ):
        write_token_shard(
            Path(path),
            [samples[n] for n in members],
            [tokenized.sample_ids[n] for n in members],
            {**attrs, "shard": shard},
        )
        shard_stats.append(
            {
                "samples": len(members),
                "tokens": sum(lengths[n] for n in members),
                "loss_tokens": int(sum(samples[n][1].sum() for n in members)),
            }
        )
    return shard_stats


def tokenize_split(
    conversations: str,
    tokenizer_dir: str,
    out_shards: list[str],
    out_rejects: str,
    out_stats: str,
    *,
    split: str,
    max_length: int,
    model_id: str,
    trust_remote_code: bool = False,
    workers: int = 1,
) -> dict:
    """Tokenize one prepared split into `len(out_shards)` token shards on `workers` processes (the
    outputs are the same for any number; one for a split under PARALLEL_MIN_BYTES); returns the stats."""
    if not out_shards:
        raise ValueError("out_shards is empty: at least one shard is needed")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code)
    if os.path.getsize(conversations) < PARALLEL_MIN_BYTES:
        workers = 1
    with _builder(tokenizer, tokenizer_dir, trust_remote_code, max_length, workers) as build:
        tokenized = _tokenize_records(conversations, build)
    attrs = {
        "split": split,
        "num_shards": len(out_shards),
        "model_id": model_id,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": chat_template_hash(tokenizer),
        "max_length": max_length,
        "eyas_version": EYAS_VERSION,
    }
    shard_stats = _write_shards(out_shards, tokenized, attrs)
    lengths = [len(ids) for ids, _ in tokenized.samples]
    stats = {
        "read": tokenized.read,
        "kept": len(tokenized.samples),
        "rejected": len(tokenized.rejects),
        "by_reason": dict(sorted(tokenized.by_reason.items())),
        "tokens": sum(lengths),
        "loss_tokens": sum(s["loss_tokens"] for s in shard_stats),
        "max_sample_tokens": max(lengths, default=0),
        "shards": shard_stats,
        "workers": workers,  # processes that built the samples (the outputs are the same for any number)
    }
    with atomic_file(out_rejects) as fh:
        for row in tokenized.rejects:
            fh.write(dumps_line(row))
    with atomic_file(out_stats) as fh:
        json.dump(stats, fh, indent=2)
        fh.write("\n")
    return stats
