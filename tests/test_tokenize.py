"""tokenize: exact ChatML loss-mask goldens, template edge cases, sharding, tokenize_split outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from eyas.core.provenance import chat_template_hash, tokenizer_hash
from eyas.data.formats import normalize_record
from eyas.data.tokenize import (
    TOOLS_SYSTEM_PREFIX,
    SampleRejected,
    assign_shards,
    build_sample,
    read_prepared,
    render_prompt,
    render_prompts,
    tokenize_split,
)
from eyas.model.target import load_tokenizer
from eyas.store import read_token_shard

DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)
CHATML_LOOP = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def masked_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans, current = [], []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def assert_assistant_mask(tokenizer, messages, ids, mask) -> None:
    """Masked tokens are exactly each assistant turn's `content + <|im_end|>`, and nothing else."""
    spans = masked_spans(ids, mask)
    answers = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert [tokenizer.decode(s) for s in spans] == answers
    assert spans == [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    assert all(s[-1] == tokenizer.eos_token_id for s in spans)
    assert sum(mask) == sum(len(s) for s in spans)


@pytest.fixture
def make_tokenizer(tokenizer_dir):
    def make(template: str):
        tok = load_tokenizer(tokenizer_dir)
        tok.chat_template = template
        return tok

    return make


# --------------------------------------------------------------------------- ChatML goldens
def test_golden_multi_turn_with_system(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4, of course.\nAnything else?"},
    ]
    ids, mask = build_sample(tokenizer, messages, None)
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4, of course.\nAnything else?<|im_end|>\n"
    )
    assert_assistant_mask(tokenizer, messages, ids, mask)
    assert mask[-1] == 0 and ids[-1] == tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    # Golden ids of the first assistant turn: "Hello!" + <|im_end|> (2).
    first = masked_spans(ids, mask)[0]
    assert first[-1] == 2 and tokenizer.decode(first[:-1]) == "Hello!"


def test_golden_without_system_gets_default_prompt(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    ids, mask = build_sample(tokenizer, messages, None)
    text = tokenizer.decode(ids)
    assert text.startswith(DEFAULT_SYSTEM)  # the template's default system prompt, never masked
    assert_assistant_mask(tokenizer, messages, ids, mask)
    n_system = len(tokenizer(DEFAULT_SYSTEM, add_special_tokens=False)["input_ids"])
    assert not any(mask[:n_system])


def test_golden_tool_turns_from_sharegpt(tokenizer):
    raw = {
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
            {"from": "observation", "value": '{"temp_c": 18}'},
            {"from": "gpt", "value": "It is 18 °C."},
        ],
        "tools": '[{"name": "get_weather", "parameters": {}}]',
    }
    record = normalize_record(raw, "t:1")
    ids, mask = build_sample(tokenizer, record["messages"], record["tools"])
    assert tokenizer.decode(ids) == (
        f"<|im_start|>system\n{TOOLS_SYSTEM_PREFIX}"
        + '[{"name": "get_weather", "parameters": {}}]<|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>\n'
        '<|im_start|>tool\n{"temp_c": 18}<|im_end|>\n'
        "<|im_start|>assistant\nIt is 18 °C.<|im_end|>\n"
    )
    assert_assistant_mask(tokenizer, record["messages"], ids, mask)


def test_tools_appended_to_existing_system(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hey"},
    ]
    ids, _ = build_sample(tokenizer, messages, '[{"name": "f"}]')
    assert tokenizer.decode(ids).startswith(
        f'<|im_start|>system\nBe brief.\n\n{TOOLS_SYSTEM_PREFIX}[{{"name": "f"}}]'
    )


def test_render_prompt_stops_before_last_assistant_turn(tokenizer):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye!"},
    ]
    prompt = render_prompt(tokenizer, messages, None)
    ids, mask = build_sample(tokenizer, messages, None)
    assert ids[: len(prompt)] == prompt
    assert tokenizer.decode(prompt).endswith("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    assert mask[len(prompt)] == 1 and not any(mask[len(prompt) - 3 : len(prompt)])


def test_prompts_rendered_together_are_the_prompts_rendered_one_at_a_time(tokenizer):
    """`render_prompts` tokenizes a round's texts in one call: the same ids as `render_prompt` each,
    tools placed as for training; the first conversation that cannot be rendered is rejected."""
    talk = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is the weather in Paris, and in 東京?"},
        {"role": "assistant", "content": "Sunny."},
    ]
    conversations = [
        (talk, None),
        (talk[:2], '[{"name": "get_weather"}]'),
        ([{"role": "system", "content": "Be brief."}, *talk], None),
    ]
    together = render_prompts(tokenizer, conversations)
    assert together == [render_prompt(tokenizer, messages, tools) for messages, tools in conversations]
    assert len({len(ids) for ids in together}) == 3 and render_prompts(tokenizer, []) == []
    with pytest.raises(SampleRejected, match="no assistant turn"):
        render_prompts(tokenizer, [(talk, None), (talk[:1], None)])


# --------------------------------------------------------------------------- rejects and templates
def test_history_rewriting_template_is_not_prefix_stable(make_tokenizer):
    # Like thinking templates: earlier assistant turns render differently from the last one.
    tok = make_tokenizer(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}[...]{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    with pytest.raises(SampleRejected) as err:
        build_sample(tok, messages, None)
    assert err.value.reason == "template_not_prefix_stable" and "messages[:2]" in err.value.detail


def test_template_that_reads_tools_gets_them(make_tokenizer):
    tok = make_tokenizer(
        "{% if tools %}<|im_start|>system\nTOOLS {{ tools | tojson }}<|im_end|>\n{% endif %}" + CHATML_LOOP
    )
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]
    ids, mask = build_sample(tok, messages, '[{"name": "f"}]')
    text = tok.decode(ids)
    assert text.startswith('<|im_start|>system\nTOOLS [{"name": "f"}]<|im_end|>\n<|im_start|>user')
    assert TOOLS_SYSTEM_PREFIX not in text
    assert_assistant_mask(tok, messages, ids, mask)


def test_template_without_eos_rejects(make_tokenizer):
    tok = make_tokenizer(
        "{% for m in messages %}{{ m.role }}:\n{{ m.content }}\n\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:\n{% endif %}"
    )
    with pytest.raises(SampleRejected) as err:
        build_sample(tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None)
    assert err.value.reason == "no_end_of_turn"


def test_token_merge_across_turn_boundary_is_not_prefix_stable(make_tokenizer):
    # "assistant: " + "b" tokenizes as "assistant:" + " b": the prompt is not a token prefix.
    tok = make_tokenizer(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(SampleRejected) as err:
        build_sample(tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None)
    assert err.value.reason == "template_not_prefix_stable" and "generation prompt" in err.value.detail


def test_template_exception_rejects(make_tokenizer):
    tok = make_tokenizer(
        "{% if messages[0].role != 'system' %}{{ raise_exception('need system') }}{% endif %}"
    )
    with pytest.raises(SampleRejected) as err:
        build_sample(tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None)
    assert err.value.reason == "template_error" and "need system" in err.value.detail


@pytest.mark.parametrize("where", ["user", "assistant"])
def test_special_token_text_in_content_rejects(tokenizer, where):
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    messages[where == "assistant"]["content"] = "x<|im_end|>\n<|im_start|>assistant\ny"
    with pytest.raises(SampleRejected) as err:
        build_sample(tokenizer, messages, None)
    assert err.value.reason == "special_token_in_content" and where in err.value.detail


def test_no_assistant_turn_has_no_loss_tokens(tokenizer):
    with pytest.raises(SampleRejected) as err:
        build_sample(tokenizer, [{"role": "user", "content": "a"}], None)
    assert err.value.reason == "no_loss_tokens"


# --------------------------------------------------------------------------- sharding
def test_assign_shards_balanced_deterministic_in_order():
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 500, size=200).tolist()
    shards = assign_shards(lengths, 4)
    assert sorted(n for s in shards for n in s) == list(range(200))
    assert all(s == sorted(s) for s in shards)
    totals = [sum(lengths[n] for n in s) for s in shards]
    assert max(totals) - min(totals) <= max(lengths)
    assert assign_shards(lengths, 4) == shards
    assert assign_shards([1, 1, 1], 2) == [[0, 2], [1]]  # ties go to the lowest shard index
    assert assign_shards([1], 3) == [[0], [], []]


# --------------------------------------------------------------------------- tokenize_split
def write_prepared(path: Path, conversations: list[list[dict]]) -> None:
    rows = [
        {"id": f"c{i}", "source": f"raw.jsonl:{i + 1}", "messages": m, "tools": None}
        for i, m in enumerate(conversations)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def chat(user: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def run_tokenize(
    tmp_path: Path, tokenizer_dir, split: str, num_shards: int, max_length: int, workers: int = 1
):
    """`tokenize_split` of tmp_path/<split>.jsonl into `num_shards` shards there: (stats, shards)."""
    shards = [str(tmp_path / f"shard-{i:05d}.zarr") for i in range(num_shards)]
    stats = tokenize_split(
        str(tmp_path / f"{split}.jsonl"),
        str(tokenizer_dir),
        shards,
        str(tmp_path / "rejects.jsonl"),
        str(tmp_path / "stats.json"),
        split=split,
        max_length=max_length,
        model_id="tiny",
        workers=workers,
    )
    return stats, shards


def test_worker_processes_write_what_one_process_writes(tmp_path, tokenizer_dir, monkeypatch):
    import eyas.data.tokenize

    monkeypatch.setattr(eyas.data.tokenize, "RECORDS_PER_TASK", 3)  # several tasks a worker
    conversations = [chat(f"question {i} " * (i % 7), f"answer {i} " * (i % 5 + 1)) for i in range(40)]
    conversations[7] = [{"role": "user", "content": "only a question"}]  # a reject among them
    conversations[23] = chat("long " * 100, "answer " * 50)
    written = {}
    for workers, min_bytes in ((1, 0), (2, 0), (2, 1 << 40)):  # the last: a small split, one process
        monkeypatch.setattr(eyas.data.tokenize, "PARALLEL_MIN_BYTES", min_bytes)
        out = tmp_path / f"{workers}-{min_bytes}"
        out.mkdir()
        write_prepared(out / "train.jsonl", conversations)
        stats, shards = run_tokenize(
            out, tokenizer_dir, "train", num_shards=2, max_length=128, workers=workers
        )
        assert stats["read"] == 40 and stats["rejected"] == 2, stats
        arrays = [
            (s.input_ids.tobytes(), s.loss_mask.tobytes(), s.sample_offsets.tobytes(), s.attrs["sample_ids"])
            for s in map(read_token_shard, shards)
        ]
        assert stats.pop("workers") == (2 if (workers, min_bytes) == (2, 0) else 1)  # the pool ran, or not
        written[workers, min_bytes] = (arrays, (out / "rejects.jsonl").read_bytes(), stats)
    assert written[2, 0] == written[1, 0] == written[2, 1 << 40]


def test_tokenize_split_shards_rejects_and_stats(tmp_path, tokenizer_dir, tokenizer):
    conversations = [
        chat("short", "ok"),
        chat("long " * 100, "answer " * 50),  # too_long at max_length 128
        [{"role": "user", "content": "only a question"}],  # no_loss_tokens
        chat("medium question here", "a medium answer"),
        chat("bad", "<|im_start|>"),  # special_token_in_content
        chat("third", "three"),
    ]
    write_prepared(tmp_path / "train.jsonl", conversations)
    stats, shards = run_tokenize(tmp_path, tokenizer_dir, "train", num_shards=2, max_length=128)
    assert json.loads((tmp_path / "stats.json").read_text()) == stats
    assert stats["read"] == 6 == stats["kept"] + stats["rejected"] and stats["kept"] == 3
    assert stats["by_reason"] == {"no_loss_tokens": 1, "special_token_in_content": 1, "too_long": 1}
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    too_long = next(r for r in rejects if r["reason"] == "too_long")
    assert (
        too_long["id"] == "c1"
        and too_long["source"] == "raw.jsonl:2"
        and "> max_length 128" in too_long["detail"]
    )

    seen = {}
    for shard_index, path in enumerate(shards):
        shard = read_token_shard(path)
        attrs = shard.attrs
        assert attrs["split"] == "train" and attrs["shard"] == shard_index and attrs["num_shards"] == 2
        assert attrs["model_id"] == "tiny" and attrs["max_length"] == 128
        assert attrs["tokenizer_hash"] == tokenizer_hash(tokenizer)
        assert attrs["chat_template_hash"] == chat_template_hash(tokenizer)
        assert stats["shards"][shard_index]["samples"] == shard.num_samples
        assert stats["shards"][shard_index]["tokens"] == len(shard.input_ids)
        order = [int(i[1:]) for i in attrs["sample_ids"]]
        assert order == sorted(order)  # input order within a shard
        for s, sample_id in enumerate(attrs["sample_ids"]):
            seen[sample_id] = shard.sample(s)
    assert sorted(seen) == ["c0", "c3", "c5"]
    for sample_id, (ids, mask) in seen.items():
        want_ids, want_mask = build_sample(tokenizer, conversations[int(sample_id[1:])], None)
        assert ids.tolist() == want_ids and mask.tolist() == want_mask
    assert stats["tokens"] == sum(len(ids) for ids, _ in seen.values())
    assert stats["loss_tokens"] == sum(int(mask.sum()) for _, mask in seen.values())


def test_tokenize_split_empty_shards_are_valid(tmp_path, tokenizer_dir):
    write_prepared(tmp_path / "eval.jsonl", [chat("q", "a")])
    stats, shards = run_tokenize(tmp_path, tokenizer_dir, "eval", num_shards=3, max_length=64)
    assert [s["samples"] for s in stats["shards"]] == [1, 0, 0]
    empty = read_token_shard(shards[2])
    assert empty.num_samples == 0 and empty.sample_offsets.tolist() == [0] and empty.attrs["sample_ids"] == []
    assert (tmp_path / "rejects.jsonl").read_text() == ""


def test_read_prepared_names_bad_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        json.dumps({"id": "a", "messages": [], "tools": None}) + "\n" + json.dumps({"id": 3}) + "\n"
    )
    with pytest.raises(ValueError, match=r"train\.jsonl:2: field 'id'"):
        list(read_prepared(path))


def test_tokenize_split_fails_when_every_conversation_is_rejected(tmp_path, tokenizer_dir):
    # A wrong eos in a converted tokenizer once rejected every sample; empty shards must not go on.
    write_prepared(tmp_path / "train.jsonl", [chat("long " * 100, "x"), chat("bad", "<|im_start|>")])
    with pytest.raises(ValueError, match=r"train.jsonl: all 2 conversations rejected .*'too_long': 1") as err:
        run_tokenize(tmp_path, tokenizer_dir, "train", num_shards=1, max_length=128)
    assert "first: id 'c0': too_long" in str(err.value)
    assert not any(tmp_path.glob("shard-*")) and not (tmp_path / "stats.json").exists()


@pytest.mark.workflow
def test_tokenize_rule_runs_a_large_split_on_workers_through_snakemake(tmp_path, tiny_model_dir):
    """Under Snakemake the workers' spawn re-imports the rule's script as __mp_main__: the split must be
    tokenized, not hang (a script without its main guard would start the stage in every worker)."""
    import shutil
    import subprocess
    import sys

    import eyas.data.tokenize

    repo = Path(__file__).parents[1]
    prepared = tmp_path / "results" / "prepared"
    prepared.mkdir(parents=True)
    shutil.copytree(tiny_model_dir, tmp_path / "results" / "assets" / "model")
    conversations = [chat(f"question {i}: " + "word " * 300, f"answer {i}") for i in range(3000)]
    write_prepared(prepared / "train.jsonl", conversations)
    assert (prepared / "train.jsonl").stat().st_size >= eyas.data.tokenize.PARALLEL_MIN_BYTES
    cmd = [sys.executable, "-m", "snakemake", "-d", str(tmp_path), "--configfile",
           str(repo / "tests" / "workflow" / "config.yaml"), "--cores", "2", "results/tokens/train",
           "--allowed-rules", "tokenize"]  # fmt: skip
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    stats = json.loads((tmp_path / "results" / "tokens" / "train" / "stats.json").read_text())
    assert stats["read"] == 3000 == stats["kept"] + stats["rejected"] and stats["workers"] == 2, stats
