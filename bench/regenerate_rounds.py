"""The regenerate stage's own CPU work between its engine calls: every turn round of a prepared split
(`regenerate_rounds`), with a stand-in generator that answers each prompt at once with the same
tokens, so what is timed is the stage's Python: the later rounds' prompts rendered from the regenerated
histories and the answers decoded. On the GPU that work runs while the engines wait for the next round.

Cases, alternated in one run: `together` (the stage: a round's histories tokenized in one call,
`eyas.data.tokenize.render_prompts`) and `one-at-a-time` (each history tokenized by its own call, as
before). Both must write the same bytes.

    PYTHONPATH=src .venv/bin/python bench/regenerate_rounds.py --model results/assets/model \
        --prepared results/prepared/train.jsonl --out bench/results/regenerate-rounds-cpu.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

from eyas.data.tokenize import render_prompt
from eyas.model.target import load_tokenizer
from eyas.regenerate import responses

TEXT = (
    "The committee reviews the annual budget line by line, and every member writes a short note on what "
    "they would change and why, with the figures that support it. "
)


def one_at_a_time(tokenizer, conversations):
    return [render_prompt(tokenizer, messages, tools) for messages, tools in conversations]


def run_case(case: str, tokenizer, prepared: Path, answer: list[int], args, work: Path) -> dict:
    """One pass over the split: seconds of preparation, of the rounds (generator excluded) and of writing."""
    render = responses.render_prompts
    if case == "one-at-a-time":
        responses.render_prompts = one_at_a_time
    generator_seconds, prompts = [0.0], []

    def generate(batch):
        start = time.perf_counter()
        prompts.append(len(batch))
        out = [list(answer) for _ in batch]
        generator_seconds[0] += time.perf_counter() - start
        return out

    try:
        began = time.perf_counter()
        limit = args.max_length - args.max_new_tokens
        state = responses.prepare_split(
            prepared, tokenizer, max_prompt_length=limit, samples=args.samples, turns="all"
        )
        prepared_at = time.perf_counter()
        responses.regenerate_rounds([state], generate, tokenizer, max_prompt_length=limit)
        rounds_at = time.perf_counter()
        out = work / f"{case}.jsonl"
        stats = responses.write_split(state, out)
        written_at = time.perf_counter()
    finally:
        responses.render_prompts = render
    return {
        "case": case,
        "prepare_seconds": round(prepared_at - began, 3),
        "rounds_seconds": round(rounds_at - prepared_at - generator_seconds[0], 3),
        "write_seconds": round(written_at - rounds_at, 3),
        "prompts_a_round": prompts,
        "turns_regenerated": stats["turns_regenerated"],
        "output_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the target's HF dir (its tokenizer is used)")
    ap.add_argument(
        "--prepared", type=Path, required=True, help="a prepared split (results/prepared/*.jsonl)"
    )
    ap.add_argument("--out", type=Path, required=True, help="the result JSON")
    ap.add_argument("--samples", type=int, default=4, help="regenerate.samples (the GPU recipe's)")
    ap.add_argument(
        "--answer-tokens", type=int, default=253, help="tokens a stand-in answer (H100 run's mean)"
    )
    ap.add_argument("--max-length", type=int, default=2048, help="tokenize.max_length")
    ap.add_argument("--max-new-tokens", type=int, default=384, help="regenerate.max_new_tokens")
    ap.add_argument("--repeats", type=int, default=2, help="passes of each case, alternated")
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.model)
    answer = tokenizer((TEXT * 20), add_special_tokens=False)["input_ids"][: args.answer_tokens]
    cases = []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.repeats):
            for case in ("together", "one-at-a-time"):
                cases.append(run_case(case, tokenizer, args.prepared, answer, args, Path(work)))
                print(cases[-1], flush=True)
    if len({c["output_sha256"] for c in cases}) != 1:
        raise SystemExit("regenerate_rounds: the cases wrote different outputs")
    best = {
        name: min(c["rounds_seconds"] for c in cases if c["case"] == name)
        for name in ("together", "one-at-a-time")
    }
    result = {
        "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable), *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cases": cases,
        "rounds_seconds_best": best,
        "ratio_one_at_a_time_to_together": round(best["one-at-a-time"] / best["together"], 2),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"rounds_seconds_best": best, "ratio": result["ratio_one_at_a_time_to_together"]}))


if __name__ == "__main__":
    main()
