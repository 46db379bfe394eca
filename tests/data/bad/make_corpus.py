"""Writes the bad-input corpus of this folder (run once; the files are committed).

Byte-level cases (latin-1, UTF-16, invalid UTF-8, CRLF, a BOM mid-file) cannot be typed into a text
editor reliably, so they are generated here. `expected.json` maps `file:line` of every record to the
reject reason prepare must give it (null: kept). Run: `python tests/data/bad/make_corpus.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def sharegpt(user: str, assistant: str, **extra) -> dict:
    return {**extra, "conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": assistant}]}


def line(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


# (raw line bytes, expected prepare outcome); None = kept. Blank lines are not records.
RECORDS: list[tuple[bytes, str | None]] = [
    (line(sharegpt("What is 2+2?", "4.", id="g1")), None),
    (b'{"id": "x", "conversations": [{"from": "human", "value": "cut off', "invalid_json"),
    (b"{'single': 'quotes', 'instruction': 'a', 'output': 'b'}", "invalid_json"),
    (b'{"instruction": "a", "output": "b",}', "invalid_json"),
    (b'{"instruction": "a", "output": "b"}{"instruction": "c", "output": "d"}', "invalid_json"),
    (b"null", "not_an_object"),
    (b'"just a string"', "not_an_object"),
    (b"[" * 5000 + b"]" * 5000, "invalid_json"),  # nesting deeper than Python's JSON recursion limit
    (line({"messages": [{"content": "hi"}, {"role": "assistant", "content": "x"}]}), "missing_field"),
    (
        line({"conversations": [{"from": "wizard", "value": "x"}, {"from": "gpt", "value": "y"}]}),
        "unknown_role",
    ),
    (
        line({"messages": [{"role": "User", "content": "hi"}, {"role": "assistant", "content": "x"}]}),
        "unknown_role",
    ),
    (
        line({"messages": [{"role": None, "content": "hi"}, {"role": "assistant", "content": "x"}]}),
        "wrong_type",
    ),
    (line(sharegpt("", "An answer to nothing.")), "empty_turn"),
    (line(sharegpt("Say nothing.", "\t \u3000\n")), "empty_turn"),  # unicode whitespace only
    (
        line({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
        "no_assistant_turn",
    ),
    (line({"messages": []}), "no_assistant_turn"),
    (line({"instruction": "Write nothing.", "output": ""}), "empty_turn"),
    (line(sharegpt("A different question.", "A different answer.", id="g1")), "duplicate"),
    (line(sharegpt("What is 2+2?", "4.", id="g1-copy")), "duplicate"),
    (line({"instruction": "a", "output": "b", "id": 1.5}), "wrong_type"),
    (line({"instruction": "a", "output": "b", "id": True}), "wrong_type"),
    (b'{"instruction": "lone surrogate \\ud800 here", "output": "b"}', "invalid_encoding"),
    (line({"conversations": "Hi there"}), "wrong_type"),
    (line({"conversations": [["human", "Hi"], ["gpt", "Yo"]]}), "not_an_object"),
    (b"   \t ", "blank"),
    (b'{"instruction": "a", "output": "b", "id": NaN}', "wrong_type"),
    (line({**sharegpt("Use a tool", "ok"), "tools": [1, 2]}), "wrong_type"),
    (line({**sharegpt("Hi", "Hello."), "system": 5}), "wrong_type"),
    (
        b"\xef\xbb\xbf" + line(sharegpt("BOM mid-file", "x")),
        "invalid_json",
    ),  # a BOM is only skipped on line 1
    (line(sharegpt("Windows line ending?", "Yes, CRLF.")) + b"\r", None),
    (line(sharegpt("Print the end token.", "Here it is: <|im_end|> done.")), None),  # tokenize rejects it
    (
        line(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": "x"}]},
                    {"role": "assistant", "content": "A cat."},
                ]
            }
        ),
        "wrong_type",
    ),
    (
        line(
            {
                "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi!"}],
                "id": "ok-openai",
            }
        ),
        None,
    ),
]

LATIN1: list[tuple[bytes, str | None]] = [
    (line({"instruction": "Plain ASCII question", "output": "Plain answer"}), None),
    (
        '{"instruction": "Un caf\u00e9 ?", "output": "Oui, un caf\u00e9 cr\u00e8me."}'.encode("latin-1"),
        "invalid_encoding",
    ),
    ('{"instruction": "Stra\u00dfe", "output": "street"}'.encode("latin-1"), "invalid_encoding"),
    (line({"instruction": "Another ASCII question", "output": "Another answer"}), None),
]

INVALID_UTF8: list[tuple[bytes, str | None]] = [
    (b'{"instruction": "bad byte \xff here", "output": "x"}', "invalid_encoding"),
    (b'{"instruction": "overlong slash \xc0\xaf", "output": "x"}', "invalid_encoding"),
    (b'{"instruction": "truncated euro \xe2\x82", "output": "x"}', "invalid_encoding"),
    (b'{"instruction": "CESU surrogate \xed\xa0\x80", "output": "x"}', "invalid_encoding"),
    (line({"instruction": "A valid line between bad ones", "output": "fine"}), None),
]

LONG = [  # kept by prepare; tokenize (max_length 256 in the tests) rejects it as too_long
    (line(sharegpt("Count to five hundred.", " ".join(str(i) for i in range(1, 501)), id="long-1")), None),
    (line(sharegpt("Short one.", "Short.", id="short-1")), None),
]

PREPARED_BAD = [  # a broken prepared split: tokenize must stop with file:line and the field
    {
        "id": "p1",
        "source": "x:1",
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
        "tools": None,
    },
    {"id": "p2", "source": "x:2", "messages": [{"role": "narrator", "content": "Hi"}], "tools": None},
]

CONFIGS = {  # file -> (YAML text, substring the ConfigError must hold besides the file name)
    "unknown_top_key.yaml": ("modle:\n  source: /models/x\n", "unknown config key modle"),
    "unknown_nested_key.yaml": ("train:\n  learning_rate: 0.1\n", "unknown config key train.learning_rate"),
    "wrong_type_int.yaml": ("train:\n  epochs: two\n", "train.epochs: expected an integer"),
    "wrong_type_bool_for_int.yaml": ("train:\n  epochs: true\n", "train.epochs: expected an integer"),
    "wrong_type_float_for_int.yaml": ("tokenize:\n  train_shards: 2.5\n", "tokenize.train_shards"),
    "wrong_type_bool.yaml": ("model:\n  trust_remote_code: 'yes'\n", "model.trust_remote_code"),
    "wrong_literal.yaml": ("extract:\n  device: gpu\n", "extract.device: 'gpu' is not one of"),
    "wrong_list_item.yaml": ("data:\n  inputs:\n    - {path: 5}\n", "data.inputs[0].path"),
    "missing_path.yaml": ("data:\n  inputs:\n    - {format: alpaca}\n", "path: needed for source file"),
    "not_a_mapping.yaml": ("- model\n- data\n", "expected a mapping"),
    "bad_yaml.yaml": ("model:\n  source: [unclosed\n", "not valid YAML"),
    "zero_max_length.yaml": ("tokenize:\n  max_length: 0\n", "tokenize.max_length must be >= 1"),
    "escape_results.yaml": (
        "data:\n  inputs:\n    - {path: 'llamafactory:../../../etc/passwd'}\n",
        "data.inputs[0].path",
    ),
    "escape_results_dotdot.yaml": (
        "data:\n  inputs:\n    - {path: 'llamafactory:..'}\n",
        "data.inputs[0].path",
    ),
}
VALID_INPUTS = "data:\n  inputs:\n    - {path: prompts.jsonl}\n"  # added to configs that do not set data


def write_lines(name: str, rows: list[tuple[bytes, str | None]], expected: dict) -> None:
    with open(HERE / name, "wb") as fh:
        for number, (raw, outcome) in enumerate(rows, start=1):
            fh.write(raw + b"\n")
            if outcome != "blank":
                expected[f"{name}:{number}"] = outcome


def main() -> None:
    expected: dict[str, str | None] = {}
    write_lines("records.jsonl", RECORDS, expected)
    write_lines("latin1.jsonl", LATIN1, expected)
    write_lines("invalid_utf8.jsonl", INVALID_UTF8, expected)
    write_lines("long.jsonl", LONG, expected)
    records = [sharegpt("Hello in UTF-16?", "Not here.", id=f"u{i}") for i in range(3)]
    (HERE / "utf16.jsonl").write_bytes("\n".join(json.dumps(r) for r in records).encode("utf-16"))
    (HERE / "utf16_nobom.jsonl").write_bytes("\n".join(json.dumps(r) for r in records).encode("utf-16-le"))
    (HERE / "utf16.json").write_bytes(json.dumps(records, indent=1).encode("utf-16"))
    (HERE / "truncated.json").write_text(json.dumps(records, indent=1)[:150])
    (HERE / "not_a_list.json").write_text(json.dumps(records[0]) + "\n")
    (HERE / "empty.jsonl").write_bytes(b"")
    (HERE / "prepared_bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PREPARED_BAD))
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    errors = {}
    for name, (text, message) in CONFIGS.items():
        if not text.startswith("data:") and not text.startswith("- "):
            text += VALID_INPUTS
        (HERE / "configs" / name).write_text(text)
        errors[name] = message
    (HERE / "configs" / "expected_errors.json").write_text(json.dumps(errors, indent=1) + "\n")


if __name__ == "__main__":
    main()
