"""Raw conversation records -> normalized conversations (pure functions, no I/O).

Accepted record formats (auto-detected per record, or forced per file):

- ShareGPT: `{"conversations": [{"from": ..., "value": str}], "tools"?: str | list, "system"?: str}`.
  `from` maps human/user -> user, gpt/assistant/bot/model/function_call -> assistant,
  observation/tool/function -> tool, system -> system (LlamaFactory's glaive_toolcall file writes a
  tool call as a `function_call` turn and its result as an `observation` turn). Turns spelled
  `{"role", "content"}` are accepted too.
- OpenAI: `{"messages": [{"role": ..., "content": str | [{"type": "text", "text" | "value": str}]}],
  "tools"?: ...}`. Text parts are concatenated. An assistant turn's `tool_calls` become JSON lines
  `{"name": ..., "arguments": ...}` appended to its content (the same text a glaive `function_call` turn
  holds), so the drafter learns to draft tool calls.
- Alpaca: `{"instruction", "input"?, "output", "system"?, "history"?: [[user, assistant], ...]}`; the
  user turn is `instruction + "\\n\\n" + input` (just one of them if the other is empty).

Normalized (docs/design.md): `{"id", "source", "messages": [{"role", "content"}], "tools": str | None}`,
`tools` being canonical JSON text of a non-empty list of tool schemas. Content is kept byte for byte
(no stripping): the loss mask trains on exactly this text.

Turn order accepted (anything else is `bad_turn_order`): an optional system turn first, then a user
turn; user -> assistant; assistant -> user | tool; tool -> tool | assistant. The last turn must be an
assistant turn: a trailing user or tool turn is rejected (`last_turn_not_assistant`) rather than
dropped, so nothing changes silently.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

FORMATS = ("auto", "sharegpt", "openai", "alpaca")
ROLES = ("system", "user", "assistant", "tool")

# The fixed set of reasons a record is rejected for (by prepare; tokenize adds its own).
REJECT_REASONS: dict[str, str] = {
    "invalid_json": "a JSONL line that does not parse as JSON",
    "invalid_encoding": "a JSONL line that is not valid UTF-8, or text holding a lone surrogate (\\ud800)",
    "not_an_object": "a record that is not a JSON object",
    "unknown_format": "auto-detection found none of conversations / messages / instruction+output",
    "unknown_role": "a turn whose role (`from` / `role`) is not one of the accepted spellings",
    "missing_field": "a required field is absent",
    "wrong_type": "a field has the wrong JSON type (or tools is not a JSON list of objects)",
    "empty_turn": "a turn whose content is empty or only whitespace",
    "no_assistant_turn": "the conversation has no assistant turn",
    "last_turn_not_assistant": "the conversation ends with a user or tool turn",
    "bad_turn_order": "turns out of the accepted order (see module docstring)",
    "duplicate": "same id, or same messages+tools, as an earlier kept record",
}

_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}
_OPENAI_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
# Which role may follow which; None = start of the conversation (after an optional system turn).
_NEXT_ROLES = {
    None: {"user"},
    "user": {"assistant"},
    "assistant": {"user", "tool"},
    "tool": {"tool", "assistant"},
}


class RecordRejected(ValueError):
    """A record failed validation; `reason` is a key of `REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _type_name(value: Any) -> str:
    return type(value).__name__ if value is not None else "null"


def _require(record: Mapping, field: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    if field not in record:
        raise RecordRejected("missing_field", f"{where}{field!r} is missing")
    value = record[field]
    if not isinstance(value, kind) or isinstance(value, bool):
        want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise RecordRejected("wrong_type", f"{where}{field!r} is {_type_name(value)}, expected {want}")
    return value


def _optional_str(record: Mapping, field: str) -> str:
    """An optional string field; absent or null reads as ""."""
    if record.get(field) is None:
        return ""
    return _require(record, field, str)


def detect_format(record: Mapping) -> str:
    if "conversations" in record:
        return "sharegpt"
    if "messages" in record:
        return "openai"
    if "instruction" in record and "output" in record:
        return "alpaca"
    keys = ", ".join(sorted(record)[:10])
    raise RecordRejected(
        "unknown_format", f"no 'conversations', 'messages' or 'instruction'+'output' ({keys})"
    )


def normalize_tools(tools: Any) -> str | None:
    """Canonical JSON text of a tool-schema list; None when absent or empty."""
    if tools is None or tools == "":
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise RecordRejected("wrong_type", f"'tools' is not valid JSON ({err})") from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RecordRejected("wrong_type", f"'tools' is {_type_name(tools)}, expected a list of objects")
    return json.dumps(tools, ensure_ascii=False) if tools else None


def _openai_content(turn: Mapping, where: str) -> str:
    content = turn.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise RecordRejected(
                    "wrong_type", f"{where}content[{j}] is {_type_name(part)}, expected object"
                )
            if part.get("type", "text") != "text":
                raise RecordRejected(
                    "wrong_type", f"{where}content[{j}] has type {part.get('type')!r}, not text"
                )
            key = "text" if "text" in part else "value"
            texts.append(_require(part, key, str, f"{where}content[{j}]."))
        content = "".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise RecordRejected("wrong_type", f"{where}'content' is {_type_name(content)}, expected str or list")
    calls = turn.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise RecordRejected("wrong_type", f"{where}'tool_calls' is {_type_name(calls)}, expected list")
        lines = [content] if content else []
        for j, call in enumerate(calls):
            fn = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RecordRejected("wrong_type", f"{where}tool_calls[{j}] has no function name")
            arguments = fn.get("arguments", {})
            if isinstance(arguments, str):
                try:  # OpenAI sends arguments as JSON text; store them as an object like glaive does
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            lines.append(json.dumps({"name": fn["name"], "arguments": arguments}, ensure_ascii=False))
        content = "\n".join(lines)
    return content


def _sharegpt_messages(record: Mapping) -> list[dict]:
    turns = _require(record, "conversations", list)
    messages = []
    system = _optional_str(record, "system")
    if system:
        messages.append({"role": "system", "content": system})
    for i, turn in enumerate(turns):
        where = f"conversations[{i}]."
        if not isinstance(turn, dict):
            raise RecordRejected("not_an_object", f"conversations[{i}] is {_type_name(turn)}")
        role_key, content_key = (
            ("from", "value") if "from" in turn or "value" in turn else ("role", "content")
        )
        speaker = _require(turn, role_key, str, where)
        if speaker not in _SHAREGPT_ROLES:
            raise RecordRejected("unknown_role", f"{where}{role_key} = {speaker!r}")
        messages.append(
            {"role": _SHAREGPT_ROLES[speaker], "content": _require(turn, content_key, str, where)}
        )
    return messages


def _openai_messages(record: Mapping) -> list[dict]:
    turns = _require(record, "messages", list)
    messages = []
    for i, turn in enumerate(turns):
        where = f"messages[{i}]."
        if not isinstance(turn, dict):
            raise RecordRejected("not_an_object", f"messages[{i}] is {_type_name(turn)}")
        role = _require(turn, "role", str, where)
        if role not in _OPENAI_ROLES:
            raise RecordRejected("unknown_role", f"{where}role = {role!r}")
        if "content" not in turn and not turn.get("tool_calls"):
            raise RecordRejected("missing_field", f"{where}'content' is missing")
        messages.append({"role": _OPENAI_ROLES[role], "content": _openai_content(turn, where)})
    return messages


def _alpaca_messages(record: Mapping) -> list[dict]:
    instruction = _require(record, "instruction", str)
    output = _require(record, "output", str)
    extra = _optional_str(record, "input")
    system = _optional_str(record, "system")
    history = record.get("history") or []
    if not isinstance(history, list):
        raise RecordRejected("wrong_type", f"'history' is {_type_name(history)}, expected list")
    messages = [{"role": "system", "content": system}] if system else []
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise RecordRejected("wrong_type", f"history[{i}] is not a [user, assistant] pair of strings")
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    user = "\n\n".join(part for part in (instruction, extra) if part)
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    return messages


def check_messages(messages: list[dict]) -> None:
    """Validate normalized turns: non-empty content, accepted order, ends with an assistant turn."""
    for i, message in enumerate(messages):
        if not message["content"].strip():
            raise RecordRejected("empty_turn", f"turn {i} ({message['role']}) has empty content")
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordRejected("no_assistant_turn", f"roles: {[m['role'] for m in messages]}")
    previous = None
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "system" and i == 0:
            continue
        if role == "system":
            raise RecordRejected("bad_turn_order", f"turn {i} is system; only the first turn may be")
        if role not in _NEXT_ROLES[previous]:
            after = f"after {previous}" if previous else "first"
            raise RecordRejected("bad_turn_order", f"turn {i} is {role} {after}")
        previous = role
    if messages[-1]["role"] != "assistant":
        raise RecordRejected("last_turn_not_assistant", f"last turn is {messages[-1]['role']}")


def _check_encodable(messages: list[dict], tools: str | None) -> None:
    """JSON's `\\ud800` escapes decode to lone surrogates, which no UTF-8 file or tokenizer can hold."""
    texts = [(f"turn {i} ({m['role']})", m["content"]) for i, m in enumerate(messages)]
    for where, text in [*texts, ("tools", tools or "")]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RecordRejected(
                "invalid_encoding", f"{where}: lone surrogate {text[err.start]!r} at character {err.start}"
            ) from None


def content_hash(messages: list[dict], tools: str | None) -> str:
    """Stable id of a conversation's content: sha256 of canonical JSON, first 16 hex digits."""
    text = json.dumps({"messages": messages, "tools": tools}, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def normalize_record(record: Any, source: str, fmt: str = "auto") -> dict:
    """One raw record -> `{"id", "source", "messages", "tools"}`; raises `RecordRejected`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if not isinstance(record, dict):
        raise RecordRejected("not_an_object", f"record is {_type_name(record)}")
    fmt = detect_format(record) if fmt == "auto" else fmt
    parse = {"sharegpt": _sharegpt_messages, "openai": _openai_messages, "alpaca": _alpaca_messages}[fmt]
    messages = parse(record)
    tools = normalize_tools(record.get("tools"))
    check_messages(messages)
    _check_encodable(messages, tools)
    record_id = record.get("id")
    if record_id is None:
        record_id = content_hash(messages, tools)
    elif isinstance(record_id, bool) or not isinstance(record_id, str | int) or record_id == "":
        raise RecordRejected("wrong_type", f"'id' is {record_id!r}, expected a non-empty str or int")
    _check_encodable([{"role": "id", "content": str(record_id)}], None)
    return {"id": str(record_id), "source": source, "messages": messages, "tools": tools}


PROMPT_PLACEHOLDER = "(response)"  # stands for the answer a prompt asks for; dropped when rendered


def normalize_prompt_record(record: Any, source: str, fmt: str = "auto") -> dict:
    """A record of an evaluation prompt file -> `{"id", "source", "messages", "tools"}` whose last turn
    is an assistant turn: the record's own, or a placeholder after a trailing user/tool turn (and for
    an Alpaca record without `output`). Only the history before that turn is ever rendered."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if not isinstance(record, dict):
        raise RecordRejected("not_an_object", f"record is {_type_name(record)}")
    fmt = detect_prompt_format(record) if fmt == "auto" else fmt
    if fmt == "alpaca" and record.get("output") in (None, ""):
        record = {**record, "output": PROMPT_PLACEHOLDER}
    parse = {"sharegpt": _sharegpt_messages, "openai": _openai_messages, "alpaca": _alpaca_messages}[fmt]
    messages = parse(record)
    if messages and messages[-1]["role"] in ("user", "tool"):
        messages.append({"role": "assistant", "content": PROMPT_PLACEHOLDER})
    tools = normalize_tools(record.get("tools"))
    check_messages(messages)
    _check_encodable(messages, tools)
    return {
        "id": str(record.get("id") or content_hash(messages, tools)),
        "source": source,
        "messages": messages,
        "tools": tools,
    }


def detect_prompt_format(record: Mapping) -> str:
    """`detect_format`, with an Alpaca record allowed to lack its `output`."""
    if (
        "instruction" in record
        and "output" not in record
        and not ({"conversations", "messages"} & set(record))
    ):
        return "alpaca"
    return detect_format(record)


# --------------------------------------------------------------------------- regenerated sample ids
_SAMPLE_SUFFIX = re.compile(r"#s\d+$")


def sample_id(conversation_id: str, sample: int) -> str:
    """The id of response sample `sample` of a regenerated conversation: "<conversation id>#s<n>"."""
    return f"{conversation_id}#s{sample}"


def conversation_id(sample_id: str) -> str:
    """The conversation a (possibly regenerated) sample belongs to: its id without "#s<n>"."""
    return _SAMPLE_SUFFIX.sub("", sample_id)
