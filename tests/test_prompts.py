"""The prompts stage: steers, the template cut at the user turn, counts and rejects, the same seed
writing the same prompts on the HF path, and the hand-off prepare -> regenerate -> tokenize."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from eyas.config import (
    ConfigError,
    PromptSettings,
    RegenerateEngineSettings,
    RegenerateSettings,
    SglangSettings,
    load_config,
    local_paths,
)
from eyas.data.formats import PROMPT_PLACEHOLDER
from eyas.data.prepare import PROMPTS_FORMAT, prepare
from eyas.data.tokenize import render_prompt, tokenize_split, user_turn_prefix
from eyas.regenerate.filters import TurnLimits
from eyas.regenerate.mix import OPENERS, plan
from eyas.regenerate.prompts import read_tool_sets, run_prompts, write_prompts
from eyas.regenerate.responses import regenerate_split

REAL_MODEL = Path(__file__).parents[1] / "results" / "assets" / "model"  # the embedded SmolLM2, if fetched
TOOLS_EN = json.dumps([{"name": "get_weather", "description": "Weather of a city", "parameters": {}}])
TOOLS_ZH = json.dumps(
    [{"name": "查天气", "description": "查询城市天气", "parameters": {}}], ensure_ascii=False
)


def test_steers_are_seeded_mixed_and_stable_under_more_conversations():
    sets = {"en": [TOOLS_EN], "zh": [TOOLS_ZH]}
    steers = plan(2000, seed=3, chinese_share=0.48, tool_share=0.2, tool_sets=sets)
    assert steers == plan(2000, seed=3, chinese_share=0.48, tool_share=0.2, tool_sets=sets)
    assert steers[:50] == plan(50, seed=3, chinese_share=0.48, tool_share=0.2, tool_sets=sets)
    assert steers != plan(2000, seed=4, chinese_share=0.48, tool_share=0.2, tool_sets=sets)
    zh = sum(s.language == "zh" for s in steers) / len(steers)
    tools = sum(s.tools is not None for s in steers) / len(steers)
    assert 0.45 < zh < 0.51 and 0.17 < tools < 0.23, (zh, tools)
    assert all(s.tools == (TOOLS_ZH if s.language == "zh" else TOOLS_EN) for s in steers if s.tools)
    assert len({(s.topic, s.persona, s.task) for s in steers}) > 1000  # no collapse to a few steers
    assert all(("中文" in s.system) == (s.language == "zh") for s in steers)
    with pytest.raises(ValueError, match="no tool schemas"):
        plan(50, seed=0, chinese_share=0.5, tool_share=0.5, tool_sets={})


def test_user_turn_prefix_is_the_template_cut_at_the_user_content(tokenizer):
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    prefix = user_turn_prefix(tokenizer, history, None)
    assert tokenizer.decode(prefix).endswith("<|im_end|>\n<|im_start|>user\n")
    full = tokenizer.apply_chat_template([*history, {"role": "user", "content": "Why?"}], tokenize=False)
    assert prefix == tokenizer(full, add_special_tokens=False)["input_ids"][: len(prefix)]
    with_tools = tokenizer.decode(user_turn_prefix(tokenizer, history[:1], TOOLS_EN))
    assert "Be brief." in with_tools and "get_weather" in with_tools  # tools placed as for training


class Scripted:
    """A generator that answers each prompt with the next scripted text (tokens; `cap` = cut off)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls = tokenizer, list(texts), []

    def __call__(self, prompts):
        self.calls.append(prompts)
        out = []
        for _ in prompts:
            text = self.texts.pop(0)
            tokens = self.tokenizer(" cut" if text == "cap" else text, add_special_tokens=False)["input_ids"]
            out.append(tokens * 20 if text == "cap" else tokens)
        return out


def test_counts_add_up_and_follow_ups_see_the_answers(tokenizer):
    steers = plan(5, seed=0, chinese_share=0.0, tool_share=0.0, tool_sets={})
    limits = TurnLimits(max_new_tokens=20, max_tokens=18, near_duplicate_jaccard=0.7)
    users = Scripted(
        tokenizer,
        [
            "How do tides work on the coast of Brittany?",
            "",
            "cap",
            "how do tides work on the  coast of Brittany?",
            "Name three red fruits please.",  # round 1
            "And why are there two tides a day?",
            "Which one is the sweetest fruit of the three?",  # round 2
        ],
    )
    answers = Scripted(tokenizer, ["The moon pulls the sea.", "Strawberries, cherries, apples."])
    records, rejects, stats = write_prompts(steers, users, answers, tokenizer, limits, turns=2, seed=0)
    assert stats["conversations"] == 5 == stats["kept"] + stats["rejected"] and stats["kept"] == 2
    assert stats["turns_written"] == 7 == stats["turns_kept"] + stats["turns_rejected"]
    assert stats["by_reason"] == {"cut_off": 1, "duplicate": 1, "empty": 1}
    assert [r["reason"] for r in rejects] == ["empty", "cut_off", "duplicate"]
    near = write_prompts(
        steers[:2],
        Scripted(tokenizer, ["How do tides work?", "How do tides work!"]),
        None,
        tokenizer,
        limits,
        turns=1,
        seed=0,
    )[1]
    assert [r["reason"] for r in near] == ["near_duplicate"]  # same words, other punctuation
    assert stats["answers_written"] == 2 == stats["answers_kept"]
    assert [m["role"] for m in records[0]["messages"]] == ["user", "assistant", "user"]
    assert records[0]["messages"][1]["content"] == "The moon pulls the sea."
    follow_up_prompt = tokenizer.decode(users.calls[1][0])
    assert "The moon pulls the sea." in follow_up_prompt and steers[0].system in follow_up_prompt
    answer_prompt = tokenizer.decode(answers.calls[0][0])
    assert steers[0].system not in answer_prompt  # answers see the conversation, not the steer


def test_openers_are_drawn_last_in_the_steers_language():
    sets = {"en": [TOOLS_EN], "zh": [TOOLS_ZH]}
    shares = dict(seed=3, chinese_share=0.48, tool_share=0.2, tool_sets=sets)
    bare, opened = plan(500, **shares), plan(500, **shares, opener_share=0.5)
    assert all(s.opener == "" for s in bare)
    assert [dataclasses.replace(s, opener="") for s in opened] == bare  # the other fields unchanged
    assert 0.4 < sum(bool(s.opener) for s in opened) / 500 < 0.6
    assert all(s.opener in OPENERS[s.language] for s in opened if s.opener)


def test_a_first_turn_with_an_opener_is_the_opener_and_its_continuation(tokenizer):
    steers = plan(3, seed=0, chinese_share=0.0, tool_share=0.0, tool_sets={}, opener_share=1.0)
    limits = TurnLimits(max_new_tokens=20, max_tokens=11, near_duplicate_jaccard=0.7)
    written = [" the tides.", " a b c d e f g h i j k", " a poem."]
    users = Scripted(tokenizer, written)
    records, rejects, stats = write_prompts(steers, users, None, tokenizer, limits, turns=1, seed=0)
    for steer, prompt in zip(steers, users.calls[0], strict=True):
        opener = tokenizer(steer.opener, add_special_tokens=False)["input_ids"]
        assert prompt[-len(opener) :] == opener  # the target continues the opener
        assert tokenizer.decode(prompt[: -len(opener)]).endswith("<|im_start|>user\n")
    kept = [r["messages"][0]["content"] for r in records]
    assert kept == [f"{steers[0].opener} the tides.", f"{steers[2].opener} a poem."]
    assert records[0]["steer"]["opener"] == steers[0].opener
    # 11 tokens generated, under the 20-token cap, but with the opener over max_tokens 11
    assert [r["reason"] for r in rejects] == ["too_long"] and stats["by_reason"] == {"too_long": 1}
    generated = [tokenizer(x, add_special_tokens=False)["input_ids"] for x in written]
    assert stats["new_tokens"] == sum(map(len, generated))


def _settings(**kw) -> PromptSettings:
    base = dict(
        conversations=6,
        turns=2,
        chinese_share=0.5,
        tool_share=0.5,
        max_new_tokens=6,
        max_tokens=6,
        batch_size=4,
        device="cpu",
        temperature=1.0,
    )
    return PromptSettings(**(base | kw))


def _run(model_dir, out: Path, tool_file: Path, **kw) -> dict:
    out.mkdir(exist_ok=True)
    stats = run_prompts(
        out / "p.jsonl",
        out / "r.jsonl",
        out / "s.json",
        model_dir,
        [tool_file],
        settings=_settings(**kw),
        answer_settings=RegenerateSettings(max_new_tokens=4, temperature=1.0),
        engine_settings=SglangSettings(),
    )
    return stats


@pytest.fixture
def tool_file(tmp_path) -> Path:
    path = tmp_path / "tools.json"
    rows = [
        {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "ok"}], "tools": t}
        for q, t in (("What is the weather?", TOOLS_EN), ("天气怎么样？", TOOLS_ZH))
    ]
    path.write_text(json.dumps(rows, ensure_ascii=False))
    return path


def test_tool_sets_by_language(tool_file):
    assert read_tool_sets([tool_file]) == {"en": [TOOLS_EN], "zh": [TOOLS_ZH]}


class _EngineAsked(Exception):
    """Raised by the stood-in `GenerationEngines`: the test needs the engines' args only."""


def test_sglang_backend_sizes_its_engines_as_regeneration_does(
    tmp_path, tiny_model_dir, tool_file, monkeypatch
):
    # The prompts engines are a job's first on a fresh machine: they take `regenerate.engine` (no
    # prefill graphs, decode graphs up to the admission cap, how many and how they start) instead of
    # SGLang's own sizing and one engine.
    asked = {}

    def engines(args, **kw):
        asked.update(args=args, **kw)
        raise _EngineAsked

    monkeypatch.setattr("eyas.engine.generation.GenerationEngines", engines)
    engine = RegenerateEngineSettings(
        max_running_requests=64,
        cuda_graph_max_bs=64,
        prefill_cuda_graph=False,
        engines=3,
        start_together=True,
    )
    with pytest.raises(_EngineAsked):
        run_prompts(
            tmp_path / "p.jsonl",
            tmp_path / "r.jsonl",
            tmp_path / "s.json",
            tiny_model_dir,
            [tool_file],
            settings=_settings(backend="sglang"),
            answer_settings=RegenerateSettings(max_new_tokens=4, temperature=1.0, engine=engine),
            engine_settings=SglangSettings(mem_fraction_static=0.3),
        )
    args = asked["args"]
    assert args["max_running_requests"] == 64
    assert args["cuda_graph_max_bs_decode"] == 64
    assert args["disable_prefill_cuda_graph"] is True
    assert args["mem_fraction_static"] == 0.3  # the sglang section still builds the engines
    assert (asked["count"], asked["together"]) == (3, True)
    assert asked["stage"] == f"prompts {tmp_path / 'p.jsonl'}"
    assert not (tmp_path / "p.jsonl").exists()


def test_same_seed_same_prompts_on_the_hf_path(tmp_path, tiny_model_dir, tool_file):
    torch.set_num_threads(1)
    first = _run(tiny_model_dir, tmp_path / "a", tool_file)
    second = _run(tiny_model_dir, tmp_path / "b", tool_file)
    _run(tiny_model_dir, tmp_path / "c", tool_file, seed=1)
    assert first == second and first["turns_written"] == first["turns_kept"] + first["turns_rejected"]
    for name in ("p.jsonl", "r.jsonl", "s.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "r.jsonl").read_bytes() != (tmp_path / "c" / "r.jsonl").read_bytes()


def test_prepare_regenerate_tokenize_hand_off(tmp_path, tiny_model_dir, tokenizer):
    prompts = tmp_path / "target.jsonl"
    rows = [
        {"id": "t0", "messages": [{"role": "user", "content": "Name a planet."}], "tools": None},
        {
            "id": "t1",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hey"},
                {"role": "user", "content": "Tell me a joke."},
            ],
            "tools": TOOLS_EN,
        },
        {"id": "t2", "messages": [{"role": "user", "content": "long " * 400}], "tools": None},
        {"id": "t3", "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = {k: tmp_path / f"{k}.jsonl" for k in ("train", "eval", "rejects")}
    stats = prepare(
        [(str(prompts), PROMPTS_FORMAT)],
        out["train"],
        out["eval"],
        out["rejects"],
        tmp_path / "stats.json",
        eval_fraction=0.0,
        eval_max=None,
        seed=0,
        max_conversations=None,
    )
    assert (stats["kept"], stats["by_reason"]) == (3, {"bad_turn_order": 1})  # t3 ends with an answer
    prepared = [json.loads(line) for line in out["train"].read_text().splitlines()]
    assert all(r["pending"] and r["messages"][-1]["content"] == PROMPT_PLACEHOLDER for r in prepared)
    assert render_prompt(
        tokenizer, prepared[1]["messages"], prepared[1]["tools"]
    )  # placeholder never rendered

    def answer(prompts):  # the backend is not the point here: every prompt gets the same answer
        return [tokenizer("Mars.", add_special_tokens=False)["input_ids"] for _ in prompts]

    regenerated = tmp_path / "regenerated.jsonl"
    regen = regenerate_split(out["train"], regenerated, answer, tokenizer, max_prompt_length=300)
    assert regen["too_long"] == 1 and regen["regenerated"] == 2  # t2: left unanswered
    filled = [json.loads(line) for line in regenerated.read_text().splitlines()]
    assert [r["messages"][-1]["content"] for r in filled if r["regenerated"]] == ["Mars.", "Mars."]
    shard = tmp_path / "shard"
    tok = tokenize_split(
        str(regenerated),
        str(tiny_model_dir),
        [str(shard)],
        str(tmp_path / "tr.jsonl"),
        str(tmp_path / "ts.json"),
        split="train",
        max_length=1024,
        model_id="tiny",
    )
    assert tok["read"] == 3 and tok["by_reason"].get("not_generated") == 1
    assert tok["kept"] + tok["rejected"] == 3


def test_config_of_the_target_source(tmp_path):
    base = {"data": {"inputs": [{"path": "llamafactory:alpaca_en_demo.json"}, {"source": "target"}]}}
    with pytest.raises(ConfigError, match="regenerate.enabled"):
        load_config(base)
    config = load_config(base | {"regenerate": {"enabled": True}})
    assert config.data.inputs[1].path is None and config.prompts.tool_share == 0.2
    assert local_paths(config)[0] == []  # fetched tool files are no local paths
    own = load_config(base | {"regenerate": {"enabled": True}, "prompts": {"tool_files": ["/no/tools.json"]}})
    assert local_paths(own)[0] == [("prompts.tool_files[0]", "/no/tools.json")]
    for inputs, match in (
        ([{"source": "target", "path": "x.json"}], r"data.inputs\[0\].path"),
        ([{"format": "alpaca"}], r"data.inputs\[0\].path"),
        ([{"source": "target"}, {"source": "target"}], "at most once"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config({"data": {"inputs": inputs}, "regenerate": {"enabled": True}})


@pytest.mark.skipif(not (REAL_MODEL / "model.safetensors").exists(), reason="embedded SmolLM2 not fetched")
def test_smollm2_writes_requests_that_end_their_turn(tmp_path, tool_file):
    torch.set_num_threads(2)
    stats = _run(
        REAL_MODEL,
        tmp_path / "real",
        tool_file,
        conversations=8,
        turns=1,
        chinese_share=0.0,
        tool_share=0.0,
        max_new_tokens=64,
        max_tokens=64,
        temperature=0.8,
    )
    assert stats["kept"] >= 1 and stats["by_reason"].get("cut_off", 0) < 8, stats
    kept = [json.loads(line) for line in (tmp_path / "real" / "p.jsonl").read_text().splitlines()]
    assert all(r["messages"][0]["content"].strip() for r in kept)
