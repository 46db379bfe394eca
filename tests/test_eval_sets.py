"""Evaluation prompt sets: held-out dialogues and HumanEval problems under the chat template."""

from __future__ import annotations

import json

import pytest

from eyas.evaluate.sets import HUMANEVAL_INSTRUCTION, load_prompt_set, read_humaneval

PROBLEM = {
    "task_id": "HumanEval/0",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "canonical_solution": "    return a + b\n",
}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_humaneval_prompt_is_one_user_turn(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "he.jsonl", [PROBLEM, {**PROBLEM, "task_id": "HumanEval/1"}])
    got = load_prompt_set("humaneval", path, tokenizer, limit=5, max_length=1000)
    assert len(got.prompts) == 2 and got.skipped_too_long == 0 and got.origins == ["humaneval"] * 2
    text = tokenizer.decode(got.prompts[0])
    assert HUMANEVAL_INSTRUCTION.format(prompt=PROBLEM["prompt"]) in text
    assert "return a + b" not in text  # the reference solution is never part of the prompt
    assert text.rstrip().endswith("assistant")  # ends with the generation prompt
    short = load_prompt_set("humaneval", path, tokenizer, limit=5, max_length=10)
    assert short.prompts == [] and short.skipped_too_long == 2
    assert len(load_prompt_set("humaneval", path, tokenizer, limit=1, max_length=1000).prompts) == 1


def test_heldout_prompts_from_prepared_conversations(tmp_path, tokenizer):
    record = {
        "id": "a",
        "source": "x:1",
        "messages": [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
        ],
        "tools": None,
    }
    target_written = {**record, "id": "b", "source": "results/prompts/target.jsonl:7"}
    path = write_jsonl(tmp_path / "eval.jsonl", [record, target_written])
    got = load_prompt_set("heldout", path, tokenizer, limit=4, max_length=1000)
    assert len(got.prompts) == 2 and "Hello!" not in tokenizer.decode(got.prompts[0])
    # each prompt's input file, for tau by input (`eyas.evaluate.served.tau_by_origin`)
    assert got.origins == ["x", "target.jsonl"]
    assert got.meta() == {"source": str(path), "prompts": 2, "skipped": 0, "origins": ["x", "target.jsonl"]}


def test_heldout_prompts_spread_over_the_split_keep_its_mix_of_inputs(tmp_path, tokenizer):
    def record(n: int, origin: str) -> dict:
        messages = [{"role": "user", "content": f"Question {n}"}, {"role": "assistant", "content": "A."}]
        return {"id": str(n), "source": f"{origin}:{n}", "messages": messages, "tools": None}

    # prepare writes the split in input-file order: 6 English, 3 Chinese, 3 target-written dialogues
    origins = ["en.json"] * 6 + ["zh.json"] * 3 + ["target.jsonl"] * 3
    path = write_jsonl(tmp_path / "eval.jsonl", [record(n, o) for n, o in enumerate(origins)])
    got = load_prompt_set("heldout", path, tokenizer, limit=4, max_length=1000)
    assert got.origins == ["en.json", "en.json", "zh.json", "target.jsonl"]  # items 0, 3, 6, 9
    assert "Question 9" in tokenizer.decode(got.prompts[3])
    every = load_prompt_set("heldout", path, tokenizer, limit=50, max_length=1000)
    assert every.origins == origins


def test_bad_humaneval_names_line_and_field(tmp_path):
    path = tmp_path / "he.jsonl"
    path.write_text(json.dumps(PROBLEM) + "\n" + json.dumps({"task_id": "HumanEval/1"}) + "\n")
    with pytest.raises(ValueError, match=r"he.jsonl:2: field 'prompt'"):
        read_humaneval(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"he.jsonl:1: not valid JSON"):
        read_humaneval(path)
    with pytest.raises(ValueError, match="unknown evaluation set"):
        load_prompt_set("mmlu", path, None, 1, 1)


def test_prompt_files_in_each_format_with_rejects_counted(tmp_path, tokenizer):
    """A prompt file in any input format; each record's prompt is its history before the last assistant
    turn (or all of it when it ends with a user turn); bad records rejected with reason and line."""
    records = [
        {"instruction": "Name a colour.", "input": "", "output": "Blue."},  # alpaca with its answer
        {"instruction": "Name a fruit."},  # alpaca without output: the whole record is the prompt
        {"conversations": [{"from": "human", "value": "Hello?"}]},  # sharegpt ending with a user turn
        {"messages": [{"role": "user", "content": "Count to 3"}, {"role": "assistant", "content": "1 2 3"}]},
        {"messages": [{"role": "robot", "content": "x"}]},  # unknown role
        ["not", "an", "object"],
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "{broken\n")
    got = load_prompt_set("mine", path, tokenizer, limit=10, max_length=1000, fmt="auto")
    texts = [tokenizer.decode(p) for p in got.prompts]
    assert len(texts) == 4 and "Name a colour." in texts[0] and "Blue." not in texts[0]
    assert got.origins == ["prompts.jsonl"] * 4
    assert "Name a fruit." in texts[1] and "Hello?" in texts[2] and "1 2 3" not in texts[3]
    assert all(t.rstrip().endswith("assistant") for t in texts)  # each ends with the generation prompt
    meta = got.meta()
    assert meta["read"] == 7 == meta["prompts"] + meta["skipped"] + meta["rejected"] + meta["over_limit"]
    assert [(r["source"].rsplit(":", 1)[1], r["reason"]) for r in meta["rejects"]] == [
        ("5", "unknown_role"),
        ("6", "not_an_object"),
        ("7", "invalid_json"),
    ]
    limited = load_prompt_set("mine", path, tokenizer, limit=1, max_length=1000, fmt="auto")
    assert len(limited.prompts) == 1 and limited.read == 7 and limited.over_limit == 3  # all counted
    short = load_prompt_set("mine", path, tokenizer, limit=10, max_length=5, fmt="auto")
    assert short.prompts == [] and short.skipped_too_long == 4


def test_prompt_file_json_list_in_a_forced_format(tmp_path, tokenizer):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"instruction": "Say hi", "output": "hi"}, {"conversations": []}]))
    got = load_prompt_set("mine", path, tokenizer, limit=10, max_length=1000, fmt="alpaca")
    assert len(got.prompts) == 1 and got.rejects[0]["reason"] == "missing_field"
