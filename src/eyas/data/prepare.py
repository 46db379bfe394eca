"""The prepare stage: raw record files -> normalized train/eval conversations, rejects and stats.

Inputs are read by `eyas.data.readers` (JSON, JSONL plain or compressed, Parquet files and dataset
directories; each record's source is `<file>:<line>` or `<file>:<row>`). A file that cannot be split
into records is a hard error naming the file and position; a bad JSONL line is only that record's
reject (`invalid_json` / `invalid_encoding`). No record kept from all inputs is an error too
(`EmptyDataError`, naming every file and its reject counts): nothing can be trained on.

Order of decisions per record: parse -> normalize + validate (`eyas.data.formats`) -> duplicate check
-> `max_conversations` cap. The cap keeps a deterministic random sample across all inputs (the
records of smallest `split_hash("cap:" + id, seed)`, in input order), so a small cap still sees every
input file. Records valid but beyond the cap count as `over_cap`, so
`read == kept + rejected + over_cap`. The train/eval split hashes `(seed, id)`, so a record's split
does not change when other records are added (except through the `eval_max` cap, which keeps the
eval candidates of smallest hash).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from typing import Any

from eyas.core.atomic import atomic_file
from eyas.data.formats import (
    FORMATS,
    PROMPT_PLACEHOLDER,
    RecordRejected,
    content_hash,
    normalize_prompt_record,
    normalize_record,
)
from eyas.data.readers import RawRecord, read_records

MAX_REJECT_RECORD_CHARS = 4096  # raw records in rejects.jsonl are cut to this many characters
# The format of the target's own prompts (rule `prompts`): conversations ending in a user turn whose
# answer is still to be written. Each gets a placeholder answer and `pending: true`; regenerate writes
# the answer and tokenize rejects one it did not (`not_generated`), so no placeholder is trained on.
PROMPTS_FORMAT = "prompts"


class EmptyDataError(ValueError):
    """No conversation kept from all inputs."""


def _refuse_empty(by_file: dict[str, Counter], by_reason: Counter) -> None:
    lines = [
        f"  {path}: read {c['read']}, rejected {c['rejected']}, over the cap {c['over_cap']}"
        for path, c in by_file.items()
    ]
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items())) or "none"
    raise EmptyDataError(
        "prepare: no conversation kept from the inputs:\n"
        + "\n".join(lines)
        + f"\n  rejects by reason: {reasons}"
    )


def split_hash(record_id: str, seed: int) -> float:
    """Uniform [0, 1) value of (seed, id): the split key, independent of the other records."""
    digest = hashlib.sha256(f"{seed}\0{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(ids: list[str], eval_fraction: float, eval_max: int | None, seed: int) -> list[str]:
    """'train' or 'eval' per id: eval iff its hash < eval_fraction, capped at the `eval_max` smallest."""
    keys = [split_hash(i, seed) for i in ids]
    candidates = [n for n, key in enumerate(keys) if key < eval_fraction]
    if eval_max is not None and len(candidates) > eval_max:
        candidates = sorted(candidates, key=lambda n: (keys[n], ids[n]))[:eval_max]
    chosen = set(candidates)
    return ["eval" if n in chosen else "train" for n in range(len(ids))]


def _cap_sample(ids: list[str], cap: int | None, seed: int) -> set[int]:
    """Indices of the `cap` records kept: smallest cap-hash, independent of the split hash."""
    if cap is None or cap >= len(ids):
        return set(range(len(ids)))
    order = sorted(range(len(ids)), key=lambda i: (split_hash("cap:" + ids[i], seed), i))
    return set(order[:cap])


def truncate_record(record: Any) -> Any:
    text = record if isinstance(record, str) else json.dumps(record, ensure_ascii=False)
    if len(text) <= MAX_REJECT_RECORD_CHARS:
        return record
    return text[:MAX_REJECT_RECORD_CHARS] + f"...[truncated, {len(text)} chars]"


def dumps_line(row: dict) -> str:
    """One JSONL line, readable UTF-8; a row holding a lone surrogate (a raw rejected record) is
    written with ASCII escapes instead, so it can still be written and read back."""
    text = json.dumps(row, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(row)
    return text + "\n"


def _write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    with atomic_file(path) as fh:
        for row in rows:
            fh.write(dumps_line(row))


def _normalize(raw: RawRecord, fmt: str) -> dict:
    if fmt != PROMPTS_FORMAT:
        return normalize_record(raw.record, raw.source, fmt)
    conversation = normalize_prompt_record(raw.record, raw.source, "openai")
    messages = conversation["messages"]  # a trailing user turn got the placeholder answer
    if messages[-1]["content"] != PROMPT_PLACEHOLDER or messages[-2]["role"] != "user":
        raise RecordRejected("bad_turn_order", "a target-written prompt must end with its user turn")
    return conversation | {"pending": True}


def _check_arguments(
    inputs: list[tuple[str, str]], eval_fraction: float, eval_max: int | None, max_conversations: int | None
) -> None:
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1], got {eval_fraction}")
    for name, value in (("eval_max", eval_max), ("max_conversations", max_conversations)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0 or None, got {value}")
    for path, fmt in inputs:
        if fmt not in (*FORMATS, PROMPTS_FORMAT):
            raise ValueError(f"{path}: unknown format {fmt!r}; expected one of {(*FORMATS, PROMPTS_FORMAT)}")


class _Screen:
    """Reads every input and decides each record: valid (normalized, not a duplicate) or rejected with
    its reason. Counts per file (read, kept, rejected, over_cap) and rejects per reason."""

    def __init__(self) -> None:
        self.valid: list[tuple[dict, Counter[str]]] = []  # (conversation, its file's counts)
        self.rejects: list[dict] = []
        self.by_reason: Counter[str] = Counter()
        self.by_file: dict[str, Counter[str]] = {}
        self.seen_ids: dict[str, str] = {}  # id -> source of the record that holds it
        self.seen_content: dict[str, str] = {}  # content hash -> source

    def read(self, path: str, fmt: str) -> None:
        counts = self.by_file.setdefault(str(path), Counter(read=0, kept=0, rejected=0, over_cap=0))
        for raw in read_records(path):
            counts["read"] += 1
            try:
                conversation, digest = self._check(raw, fmt)
            except RecordRejected as err:
                counts["rejected"] += 1
                self._reject(raw, err)
                continue
            self.seen_ids[conversation["id"]] = raw.source
            self.seen_content[digest] = raw.source
            self.valid.append((conversation, counts))

    def _check(self, raw: RawRecord, fmt: str) -> tuple[dict, str]:
        """(conversation, content hash) of a valid record that is no duplicate; else RecordRejected."""
        if raw.error is not None:
            raise raw.error
        conversation = _normalize(raw, fmt)
        digest = content_hash(conversation["messages"], conversation["tools"])
        if digest in self.seen_content:
            raise RecordRejected("duplicate", f"same messages and tools as {self.seen_content[digest]}")
        if conversation["id"] in self.seen_ids:
            raise RecordRejected(
                "duplicate", f"id {conversation['id']!r} already at {self.seen_ids[conversation['id']]}"
            )
        return conversation, digest

    def _reject(self, raw: RawRecord, err: RecordRejected) -> None:
        self.by_reason[err.reason] += 1
        self.rejects.append(
            {
                "source": raw.source,
                "reason": err.reason,
                "detail": err.detail,
                "record": truncate_record(raw.record),
            }
        )

    def keep_capped(self, cap: int | None, seed: int) -> list[dict]:
        """The valid conversations within the `max_conversations` cap (`_cap_sample`), in input order;
        the others count as over_cap."""
        chosen = _cap_sample([c["id"] for c, _ in self.valid], cap, seed)
        kept = []
        for index, (conversation, counts) in enumerate(self.valid):
            if index in chosen:
                counts["kept"] += 1
                kept.append(conversation)
            else:
                counts["over_cap"] += 1
        return kept

    def stats(self, train: list[dict], evaluation: list[dict]) -> dict:
        totals = Counter()
        for counts in self.by_file.values():
            totals.update(counts)
        stats = {
            "read": totals["read"],
            "kept": totals["kept"],
            "rejected": totals["rejected"],
            "over_cap": totals["over_cap"],
            "by_reason": dict(sorted(self.by_reason.items())),
            "by_file": {path: dict(counts) for path, counts in self.by_file.items()},
            "splits": {"train": len(train), "eval": len(evaluation)},
        }
        assert stats["read"] == stats["kept"] + stats["rejected"] + stats["over_cap"], stats
        return stats


def prepare(
    inputs: list[tuple[str, str]],
    out_train: str,
    out_eval: str,
    out_rejects: str,
    out_stats: str,
    *,
    eval_fraction: float,
    eval_max: int | None,
    seed: int,
    max_conversations: int | None,
) -> dict:
    """Normalize, validate, dedup, cap and split `(path, format)` inputs; returns the stats dict."""
    _check_arguments(inputs, eval_fraction, eval_max, max_conversations)
    screen = _Screen()
    for path, fmt in inputs:
        screen.read(path, fmt)
    kept = screen.keep_capped(max_conversations, seed)
    if not kept:
        _refuse_empty(screen.by_file, screen.by_reason)
    splits = assign_splits([c["id"] for c in kept], eval_fraction, eval_max, seed)
    train = [c for c, s in zip(kept, splits, strict=True) if s == "train"]
    evaluation = [c for c, s in zip(kept, splits, strict=True) if s == "eval"]
    stats = screen.stats(train, evaluation)
    _write_jsonl(out_train, train)
    _write_jsonl(out_eval, evaluation)
    _write_jsonl(out_rejects, screen.rejects)
    with atomic_file(out_stats) as fh:
        json.dump(stats, fh, indent=2)
        fh.write("\n")
    return stats
