"""Regenerate: batched left-padded generation equals one-by-one greedy decoding; records and counts for
the last turn, every turn in order, and several samples per conversation."""

from __future__ import annotations

import asyncio
import json

import torch

from eyas.evaluate.specdec import plain_generate
from eyas.model.target import load_target
from eyas.regenerate.responses import (
    HFGenerator,
    generate_batch,
    prepare_split,
    regenerate_pipelined,
    regenerate_rounds,
    regenerate_split,
    write_split,
)


def conversation(i: int, turns: int = 1) -> dict:
    messages = []
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"Question {i}.{t}: " + "why " * (i + 1)},
            {"role": "assistant", "content": f"Original answer {i}.{t}"},
        ]
    return {"id": str(i), "source": f"x:{i}", "messages": messages, "tools": None}


def test_batched_generation_equals_greedy(tiny_model_dir, tokenizer):
    torch.set_num_threads(1)
    model = load_target(tiny_model_dir)
    prompts = [[1, 42, 977], [5, 6, 7, 8, 9, 10, 11], [300]]  # different lengths: real left padding
    got = generate_batch(model, tokenizer, prompts, max_new_tokens=6, temperature=0.0)
    eos = tokenizer.eos_token_id
    for prompt, tokens in zip(prompts, got, strict=True):
        want = plain_generate(model, prompt, 6, {eos})
        assert tokens == [t for t in want if t != eos], prompt


def test_regenerate_split_replaces_last_assistant_turn(tmp_path, tiny_model_dir, tokenizer):
    model = load_target(tiny_model_dir)
    records = [conversation(0), conversation(1, turns=2), conversation(2)]
    records.append({**conversation(3), "messages": [{"role": "user", "content": "no answer"}]})
    records.append({**conversation(4), "messages": [{"role": "user", "content": "long " * 300}] +
                    conversation(4)["messages"][1:]})  # fmt: skip
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "regen.jsonl"
    generate = HFGenerator(model, tokenizer, batch_size=2, max_new_tokens=4, temperature=0.0)
    stats = regenerate_split(src, out, generate, tokenizer, max_prompt_length=200)
    assert (
        stats["read"]
        == 5
        == stats["regenerated"] + stats["empty"] + stats["too_long"] + stats["no_assistant"]
    )
    assert (
        stats["no_assistant"] == 1 and stats["too_long"] == 1 and stats["regenerated"] + stats["empty"] == 3
    )
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == ["0", "1", "2", "3", "4"]
    two_turns = written[1]
    assert two_turns["messages"][:3] == records[1]["messages"][:3]  # earlier turns kept
    if two_turns["regenerated"]:
        assert two_turns["messages"][3]["content"] != "Original answer 1.1"
    assert written[3]["messages"] == records[3]["messages"] and not written[3]["regenerated"]
    assert written[4]["messages"] == records[4]["messages"] and not written[4]["regenerated"]


class Scripted:
    """A generator that answers its n-th prompt with answers[n] and records the prompts of each call."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.prompts = tokenizer, list(answers), []

    def __call__(self, prompts):
        self.prompts.append([self.tokenizer.decode(p) for p in prompts])
        return [self.tokenizer.encode(self.answers.pop(0), add_special_tokens=False) for _ in prompts]


def test_all_turns_regenerate_in_order_from_the_regenerated_history(tmp_path, tokenizer):
    src = tmp_path / "train.jsonl"
    src.write_text(json.dumps(conversation(7, turns=3)) + "\n")
    generate = Scripted(tokenizer, ["first new", "second new", "third new"])
    stats = regenerate_split(
        src, tmp_path / "out.jsonl", generate, tokenizer, max_prompt_length=500, turns="all"
    )
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    answers = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    assert answers == ["first new", "second new", "third new"] and record["regenerated"]
    assert [m["content"] for m in record["messages"] if m["role"] == "user"] == [
        m["content"] for m in conversation(7, turns=3)["messages"] if m["role"] == "user"
    ]
    # round 2's prompt holds round 1's regenerated answer, not the dataset's
    assert "first new" in generate.prompts[1][0] and "Original answer 7.0" not in generate.prompts[1][0]
    assert stats["turns_regenerated"] == 3 and stats["turns_kept"] == 0 and stats["regenerated"] == 1


def test_samples_each_become_a_conversation_and_counts_add_up(tmp_path, tokenizer):
    records = [conversation(0), conversation(1, turns=2)]
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    # round 1: 2 conversations x 2 samples; conversation 1's sample 1 answers with nothing
    answers = iter(["a", "b", "c", ""])

    def scripted(prompts):
        return [tokenizer.encode(next(answers), add_special_tokens=False) for _ in prompts]

    out = tmp_path / "out.jsonl"
    stats = regenerate_split(src, out, scripted, tokenizer, max_prompt_length=500, samples=2)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == ["0#s0", "0#s1", "1#s0"]
    assert [r["messages"][-1]["content"] for r in written] == ["a", "b", "c"]
    assert (
        stats["read"]
        == 2
        == stats["regenerated"] + stats["empty"] + stats["too_long"] + stats["no_assistant"]
    )
    assert stats["samples_written"] == 3 and stats["turns_kept"] == 1


def _rule_answer(tokenizer, prompt: list[int]) -> list[int]:
    """A deterministic stand-in for the target: the answer is a function of the prompt (empty for
    conversation 3's, so its streams end at their first turn)."""
    text = tokenizer.decode(prompt)
    if "Question 3." in text:
        return []
    return tokenizer.encode(f"answer {len(prompt)} {text.count('answer')}", add_special_tokens=False)


class PipelinedEngines:
    """The pipelined interface of `eyas.engine.generation.GenerationEngines` (`generate_one`, `run`)
    over `_rule_answer`; `delay(prompt)` seconds before each answer, so turns come back out of order."""

    def __init__(self, tokenizer, delay=lambda prompt: 0.0):
        self.tokenizer, self.delay, self.log = tokenizer, delay, []

    async def generate_one(self, number, *, input_ids, sampling_params):
        self.log.append(("sent", number, self.tokenizer.decode(input_ids)))
        await asyncio.sleep(self.delay(input_ids))
        self.log.append(("back", number, self.tokenizer.decode(input_ids)))
        eos = self.tokenizer.eos_token_id
        return {"output_ids": [*_rule_answer(self.tokenizer, input_ids), eos, 17]}  # cut at end-of-turn

    def run(self, calls):
        return asyncio.run(calls)


def _regenerate_both_ways(tmp_path, tokenizer, engines):
    records = [conversation(i, turns=1 + i % 3) for i in range(6)]
    records[5]["messages"][0]["content"] += " long" * 60  # its later prompts outgrow the limit
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    shape = dict(max_prompt_length=200, samples=2, turns="all")
    rounds = prepare_split(src, tokenizer, **shape)
    regenerate_rounds(
        [rounds], lambda ps: [_rule_answer(tokenizer, p) for p in ps], tokenizer, max_prompt_length=200
    )
    piped = prepare_split(src, tokenizer, **shape)
    sampling = {"temperature": 0.7, "max_new_tokens": 64}
    eos = {tokenizer.eos_token_id}
    regenerate_pipelined(
        [piped], engines, tokenizer, sampling=sampling, eos_token_ids=eos, max_prompt_length=200
    )
    outs = []
    for name, state in (("rounds", rounds), ("pipelined", piped)):
        stats = write_split(state, tmp_path / f"{name}.jsonl")
        outs.append((stats, (tmp_path / f"{name}.jsonl").read_text()))
    return outs


def test_pipelined_turns_write_what_turn_rounds_write(tmp_path, tokenizer):
    # answers come back in another order than sent: later turns of short prompts overtake
    engines = PipelinedEngines(tokenizer, delay=lambda prompt: 0.02 * (len(prompt) % 5))
    (round_stats, round_text), (piped_stats, piped_text) = _regenerate_both_ways(tmp_path, tokenizer, engines)
    assert piped_text == round_text
    assert piped_stats == round_stats
    assert (
        round_stats["turns_regenerated"] > 0 and round_stats["turns_kept"] > 0 and round_stats["empty"] == 1
    )
    sent = [number for kind, number, _ in engines.log if kind == "sent"]
    assert sorted(set(sent)) == list(range(12))  # 6 conversations x 2 samples, each stream numbered


def test_a_streams_next_turn_does_not_wait_for_the_round(tmp_path, tokenizer):
    src = tmp_path / "train.jsonl"
    src.write_text(json.dumps(conversation(0, turns=1)) + "\n" + json.dumps(conversation(1, turns=2)) + "\n")
    # conversation 0's only turn is slow; conversation 1's two turns are fast
    engines = PipelinedEngines(
        tokenizer, delay=lambda p: 0.3 if "Question 0." in tokenizer.decode(p) else 0.0
    )
    state = prepare_split(src, tokenizer, max_prompt_length=500, samples=1, turns="all")
    sampling = {"temperature": 0.0, "max_new_tokens": 16}
    eos = {tokenizer.eos_token_id}
    regenerate_pipelined(
        [state], engines, tokenizer, sampling=sampling, eos_token_ids=eos, max_prompt_length=500
    )
    slow_back = next(
        i for i, (kind, _, text) in enumerate(engines.log) if kind == "back" and "Question 0." in text
    )
    second_turn_sent = next(
        i for i, (kind, _, text) in enumerate(engines.log) if kind == "sent" and "Question 1.1" in text
    )
    assert second_turn_sent < slow_back, engines.log
    assert state["stats"]["turns_regenerated"] == 3
