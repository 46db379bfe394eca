"""prepare: each input format, bad-input rejects, counts, split determinism, cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eyas.data.formats import REJECT_REASONS, RecordRejected, content_hash, normalize_record
from eyas.data.prepare import MAX_REJECT_RECORD_CHARS, assign_splits, prepare
from eyas.data.readers import InputFileError

RAW = Path(__file__).parent / "data" / "raw"

# bad.jsonl: line number -> expected reason (None = kept); line 16 is blank and is not a record.
BAD_EXPECTED = {
    1: None,
    2: "invalid_json",
    3: "invalid_encoding",
    4: "not_an_object",
    5: "unknown_format",
    6: "unknown_role",
    7: "empty_turn",
    8: "no_assistant_turn",
    9: "duplicate",
    10: "duplicate",
    11: "wrong_type",
    12: "wrong_type",
    13: "missing_field",
    14: "bad_turn_order",
    15: "last_turn_not_assistant",
    17: None,
    18: "wrong_type",
}


def run_prepare(tmp_path: Path, inputs, **kwargs) -> tuple[dict, dict[str, list[dict]]]:
    outs = {name: tmp_path / f"{name}.jsonl" for name in ("train", "eval", "rejects")}
    options = {"eval_fraction": 0.0, "eval_max": None, "seed": 0, "max_conversations": None, **kwargs}
    stats = prepare(
        [(str(p), f) for p, f in inputs],
        str(outs["train"]),
        str(outs["eval"]),
        str(outs["rejects"]),
        str(tmp_path / "stats.json"),
        **options,
    )
    assert json.loads((tmp_path / "stats.json").read_text()) == stats
    rows = {name: [json.loads(line) for line in path.read_text().splitlines()] for name, path in outs.items()}
    return stats, rows


def test_sharegpt_jsonl_with_tool_turns(tmp_path):
    stats, rows = run_prepare(tmp_path, [(RAW / "sharegpt.jsonl", "auto")])
    assert stats["kept"] == 2 and stats["rejected"] == 0
    tool, colours = rows["train"]
    assert [m["role"] for m in tool["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert tool["messages"][1]["content"] == '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert tool["messages"][3]["content"] == "It is 18 °C in Paris."
    assert json.loads(tool["tools"])[0]["name"] == "get_weather"
    assert tool["source"] == f"{RAW / 'sharegpt.jsonl'}:1"
    assert tool["id"] == content_hash(tool["messages"], tool["tools"])
    # int id kept as str; `system` field becomes the first turn; "[]" tools read as none.
    assert (
        colours["id"] == "7" and colours["tools"] is None and colours["source"].endswith("sharegpt.jsonl:2")
    )
    assert colours["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Red."},
    ]


def test_openai_content_parts_and_tool_calls(tmp_path):
    stats, rows = run_prepare(tmp_path, [(RAW / "openai.jsonl", "openai")])
    assert stats["kept"] == 2
    terse, weather = rows["train"]
    assert terse["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "5"},
    ]
    assert weather["messages"][1] == {
        "role": "assistant",
        "content": '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    }
    assert weather["messages"][2]["role"] == "tool"
    assert json.loads(weather["tools"]) == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]


def test_alpaca_json_with_input_and_history(tmp_path):
    stats, rows = run_prepare(tmp_path, [(RAW / "alpaca.json", "auto")])
    assert stats["kept"] == 2
    plain, chat = rows["train"]
    assert plain["messages"] == [
        {"role": "user", "content": "Translate to French.\n\nGood morning"},
        {"role": "assistant", "content": "Bonjour"},
    ]
    assert plain["source"] == f"{RAW / 'alpaca.json'}:0" and plain["tools"] is None
    assert chat["messages"] == [
        {"role": "system", "content": "You translate."},
        {"role": "user", "content": "Translate to French: Good morning"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "And now to German?"},
        {"role": "assistant", "content": "Guten Morgen"},
    ]
    assert chat["source"].endswith("alpaca.json:1")


def test_forced_format_mismatch_is_missing_field():
    record = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}
    with pytest.raises(RecordRejected) as err:
        normalize_record(record, "x:1", "alpaca")
    assert err.value.reason == "missing_field" and "instruction" in err.value.detail


def test_bad_inputs_rejected_with_reasons(tmp_path):
    stats, rows = run_prepare(tmp_path, [(RAW / "bad.jsonl", "auto")])
    got = {int(r["source"].rsplit(":", 1)[1]): r["reason"] for r in rows["rejects"]}
    kept = {int(r["source"].rsplit(":", 1)[1]) for r in rows["train"]}
    assert got == {line: reason for line, reason in BAD_EXPECTED.items() if reason}
    assert kept == {line for line, reason in BAD_EXPECTED.items() if reason is None}
    assert set(got.values()) <= set(REJECT_REASONS)
    assert stats["read"] == len(BAD_EXPECTED) == stats["kept"] + stats["rejected"] + stats["over_cap"]
    assert stats["by_reason"]["duplicate"] == 2 and stats["by_reason"]["wrong_type"] == 3
    assert sum(stats["by_reason"].values()) == stats["rejected"]
    assert stats["by_file"][str(RAW / "bad.jsonl")] == {"read": 17, "kept": 2, "rejected": 15, "over_cap": 0}
    by_line = {int(r["source"].rsplit(":", 1)[1]): r for r in rows["rejects"]}
    assert "caf\ufffd" in by_line[3]["record"]  # undecodable line kept as text, bytes replaced
    assert "ok-1" in by_line[10]["detail"] and by_line[9]["detail"].endswith("bad.jsonl:1")
    assert by_line[6]["record"]["conversations"][0]["from"] == "narrator"  # raw record kept


def test_huge_reject_record_is_truncated(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"conversations": [{"from": "human", "value": "x" * 10_000}]}) + "\n")
    _, rows = run_prepare(tmp_path, [(path, "auto"), (RAW / "sharegpt.jsonl", "auto")])
    (reject,) = rows["rejects"]
    assert reject["reason"] == "no_assistant_turn"
    assert isinstance(reject["record"], str) and len(reject["record"]) < MAX_REJECT_RECORD_CHARS + 50


def test_malformed_json_file_names_file_and_position(tmp_path):
    with pytest.raises(InputFileError, match=r"malformed\.json:3:23: invalid JSON"):
        run_prepare(tmp_path, [(RAW / "malformed.json", "auto")])
    not_list = tmp_path / "obj.json"
    not_list.write_text('{"instruction": "a", "output": "b"}')
    with pytest.raises(InputFileError, match=r"obj\.json: top level is dict"):
        run_prepare(tmp_path, [(not_list, "auto")])
    assert not (tmp_path / "train.jsonl").exists()  # nothing half-written


def write_alpaca(path: Path, start: int, stop: int) -> None:
    path.write_text(json.dumps([{"instruction": f"q{i}", "output": f"a{i}"} for i in range(start, stop)]))


def split_of(rows: dict[str, list[dict]]) -> dict[str, str]:
    return {r["id"]: name for name in ("train", "eval") for r in rows[name]}


def test_split_is_deterministic_and_stable(tmp_path):
    write_alpaca(tmp_path / "a.json", 0, 300)
    stats, first = run_prepare(tmp_path / "r1", [(tmp_path / "a.json", "auto")], eval_fraction=0.2, seed=3)
    _, again = run_prepare(tmp_path / "r2", [(tmp_path / "a.json", "auto")], eval_fraction=0.2, seed=3)
    assert first == again
    assert 30 <= stats["splits"]["eval"] <= 90 and stats["splits"]["train"] + stats["splits"]["eval"] == 300
    # Adding records leaves every earlier record in its split.
    write_alpaca(tmp_path / "b.json", 300, 400)
    _, grown = run_prepare(
        tmp_path / "r3",
        [(tmp_path / "a.json", "auto"), (tmp_path / "b.json", "auto")],
        eval_fraction=0.2,
        seed=3,
    )
    old, new = split_of(first), split_of(grown)
    assert all(new[i] == s for i, s in old.items())
    # Another seed gives another split.
    _, other = run_prepare(tmp_path / "r4", [(tmp_path / "a.json", "auto")], eval_fraction=0.2, seed=4)
    assert split_of(other) != old


def test_eval_max_caps_eval_split():
    ids = [f"id{i}" for i in range(100)]
    uncapped = assign_splits(ids, 0.5, None, seed=0)
    capped = assign_splits(ids, 0.5, 5, seed=0)
    assert capped.count("eval") == 5 < uncapped.count("eval")
    assert all(u == "eval" for u, c in zip(uncapped, capped, strict=True) if c == "eval")


def test_max_conversations_keeps_a_deterministic_sample_in_input_order(tmp_path):
    inputs = [(RAW / "bad.jsonl", "auto"), (RAW / "alpaca.json", "auto")]
    full_stats, full = run_prepare(tmp_path / "full", inputs, max_conversations=None)
    stats, rows = run_prepare(tmp_path / "capped", inputs, max_conversations=3)
    again_stats, again = run_prepare(tmp_path / "again", inputs, max_conversations=3)
    full_sources = [r["source"] for r in full["train"] + full["eval"]]
    sources = [r["source"] for r in rows["train"] + rows["eval"]]
    assert len(sources) == 3 and set(sources) <= set(full_sources)
    # input order is kept among the chosen records, and the choice is the same on every run
    assert sorted(sources, key=full_sources.index) == sources
    assert rows == again and stats == again_stats
    assert stats["over_cap"] == full_stats["kept"] - 3 and stats["kept"] == 3
    assert stats["read"] == stats["kept"] + stats["rejected"] + stats["over_cap"] == 19
