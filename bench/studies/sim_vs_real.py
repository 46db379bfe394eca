"""Where simulated tau and real tau part: one drafter, the same held-out prompts, four measurements.

The trainer picks its epoch by *simulated* tau (teacher-forced TTT accuracy over the held-out stores,
`eyas.train.heldout`); the evaluation reports *real* tau (speculative decoding, `eyas.evaluate.specdec`).
On the CPU default they disagree (1.56 against 1.25 at k = 4). This script measures, on the evaluation's
own prompts, which difference makes the gap:

- `dataset_all_turns`: teacher-forced on the dataset's conversation, every assistant turn (what the
  held-out stores hold);
- `dataset_first_n`: the same, only the first `max_new_tokens` tokens of the last assistant turn (the
  part of a response the evaluation decodes);
- `target_greedy`: teacher-forced on the target's own greedy continuation of each prompt (the text the
  real decode verifies);
- `real`: speculative decoding of the same prompts (`evaluate_specdec`, as the evaluation runs it).

Each teacher-forced text is scored two ways: `training`, the trainer's metric (`ttt_loss`: a position
counts only where the target's greedy token is in the draft vocab, correct = drafter argmax equals the
teacher's argmax over the draft vocab), and `serving`, what verification accepts (every position counts,
correct = the drafter's target id equals the target's greedy token over the full vocab).

  .venv/bin/python bench/studies/sim_vs_real.py --results RESULTS_DIR --out bench/results/sim-vs-real-cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from eyas.core.acceptance import max_prompt_tokens, ratio, simulated_tau
from eyas.core.atomic import atomic_file
from eyas.data.tokenize import SampleRejected, build_sample, read_prepared, render_prompt
from eyas.evaluate.specdec import evaluate_specdec, plain_generate
from eyas.model.capture import TapCapture
from eyas.model.drafter import Eagle3Drafter
from eyas.model.target import load_embed_and_head, load_target, load_tokenizer
from eyas.train.loss import shift_left, teacher_from_final, ttt_loss


def prompts_and_responses(eval_jsonl: Path, tokenizer, limit: int, max_prompt: int) -> list[dict]:
    """The evaluation's held-out prompts (`evaluate.sets.heldout_prompts`: the first `limit` that fit)
    with each conversation's tokens and the loss masks of all its assistant turns and of the last."""
    out = []
    for record in read_prepared(eval_jsonl):
        if len(out) == limit:
            break
        prompt = render_prompt(tokenizer, record["messages"], record["tools"])
        if len(prompt) > max_prompt:
            continue
        try:  # prepare kept it and tokenize did too: a rejection here means the files disagree
            ids, mask = build_sample(tokenizer, record["messages"], record["tools"])
        except SampleRejected as err:
            raise SystemExit(f"{eval_jsonl}: record {record['id']}: {err}") from err
        last = [0] * len(prompt) + mask[len(prompt) :]  # the last assistant turn only
        out.append({"id": record["id"], "prompt": prompt, "ids": ids, "mask_all": mask, "mask_last": last})
    return out


class Tally:
    """Per-step counts over many texts: positions, correct, chain-conditioned positions and correct."""

    def __init__(self, steps: int):
        self.sums = {k: [0] * steps for k in ("count", "correct", "cond_count", "cond_correct")}

    def add(self, k: int, count: int, correct: int, cond_count: int, cond_correct: int) -> None:
        for name, value in zip(self.sums, (count, correct, cond_count, cond_correct), strict=True):
            self.sums[name][k] += int(value)

    def report(self) -> dict:
        s = self.sums
        acc = [ratio(c, n) for c, n in zip(s["correct"], s["count"], strict=True)]
        cond = [ratio(c, n) for c, n in zip(s["cond_correct"], s["cond_count"], strict=True)]
        return {
            **s,
            "accuracy": acc,
            "conditional_accuracy": cond,
            "simulated_tau": simulated_tau([a or 0 for a in cond]),
        }


@torch.inference_mode()
def score_text(target, drafter, head, ids: list[int], mask: list[int], steps: int, tallies: dict) -> None:
    """Teacher-forced TTT over one text; adds to tallies["training"] and tallies["serving"]."""
    layer_ids = drafter.config.aux_layer_ids
    with TapCapture(target, layer_ids, final=True) as capture:
        target(input_ids=torch.tensor([ids]), use_cache=False)
        taps, final = capture.take()
    aux = torch.cat(taps, dim=-1)  # [1, T, 3H]
    input_ids = torch.tensor([ids])  # [1, T]
    loss_mask = torch.tensor([mask])  # [1, T]
    valid = torch.ones_like(input_ids, dtype=torch.bool)
    step_logits = drafter.ttt_forward(aux, input_ids, steps)  # steps x [1, T, D]
    draft_ids = torch.arange(len(drafter.d2t)) + drafter.d2t  # [D]
    teacher, in_vocab = teacher_from_final(final, head, draft_ids, drafter.t2d)
    _, m = ttt_loss(step_logits, teacher, in_vocab, loss_mask, valid)
    for k in range(steps):
        count, cond_count = m["count"][k], m["cond_count"][k]
        tallies["training"].add(
            k, count, round(m["acc"][k] * count), cond_count, round(m["cond_acc"][k] * cond_count)
        )
    greedy = (final[0] @ head.T).argmax(-1)[None]  # [1, T] target's greedy token after each index
    chain_ok = valid.clone()
    for k, logits in enumerate(step_logits):
        predicted = drafter.draft_to_target(logits.argmax(-1))  # [1, T] target id for token t+2+k
        counted = shift_left(loss_mask.bool(), 2 + k, False)  # token t+2+k is a response token
        correct = (predicted == shift_left(greedy, 1 + k)) & counted
        cond = counted & chain_ok
        tallies["serving"].add(k, counted.sum(), correct.sum(), cond.sum(), (correct & cond).sum())
        chain_ok = chain_ok & correct


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="a finished job's results dir")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--k", type=int, default=4, help="chain length of the real decode = TTT steps scored")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    model_dir, drafter_dir = args.results / "assets/model", args.results / "train/drafter"
    tokenizer = load_tokenizer(model_dir)
    target = load_target(model_dir)
    drafter = Eagle3Drafter.from_pretrained(drafter_dir).eval()
    _, head = load_embed_and_head(model_dir)
    head = head.float()  # [V, H]
    eos = {tokenizer.eos_token_id}
    max_prompt = max_prompt_tokens(drafter.config.max_position_embeddings, args.max_new_tokens, args.k)
    items = prompts_and_responses(
        args.results / "prepared/eval.jsonl", tokenizer, args.num_prompts, max_prompt
    )
    texts = {name: {"training": Tally(args.k), "serving": Tally(args.k)} for name in
             ("dataset_all_turns", "dataset_first_n", "target_greedy")}  # fmt: skip
    greedy_in_vocab, greedy_tokens = 0, 0
    for item in items:
        n = len(item["prompt"])
        first_n = item["mask_last"][: n + args.max_new_tokens] + [0] * max(
            0, len(item["ids"]) - n - args.max_new_tokens
        )
        score_text(target, drafter, head, item["ids"], item["mask_all"], args.k, texts["dataset_all_turns"])
        score_text(target, drafter, head, item["ids"], first_n, args.k, texts["dataset_first_n"])
        continuation = plain_generate(target, item["prompt"], args.max_new_tokens, eos)
        greedy_tokens += len(continuation)
        greedy_in_vocab += int(drafter.t2d[torch.tensor(continuation)].sum())
        ids = item["prompt"] + continuation
        score_text(
            target, drafter, head, ids, [0] * n + [1] * len(continuation), args.k, texts["target_greedy"]
        )
    decoded = evaluate_specdec(
        model_dir, drafter, [i["prompt"] for i in items], max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.k, eos_token_ids=eos, aux_layer_ids=drafter.config.aux_layer_ids,
        check_equal=False, target=target,
    )  # fmt: skip
    real = {
        key: decoded[key] for key in ("tau", "verify_passes", "acceptance_by_position", "position_attempted")
    }
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "drafter": str(drafter_dir),
        "prompts": [i["id"] for i in items],
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "greedy_tokens": greedy_tokens,
        "greedy_tokens_in_draft_vocab": greedy_in_vocab,
        "teacher_forced": {name: {m: t.report() for m, t in v.items()} for name, v in texts.items()},
        "real": real,
        "seconds": time.perf_counter() - began,
    }
    with atomic_file(args.out) as fh:
        fh.write(json.dumps(report, indent=1) + "\n")
    print(
        json.dumps(
            {
                n: {m: round(r["simulated_tau"], 3) for m, r in v.items()}
                for n, v in report["teacher_forced"].items()
            }
        )
    )
    print("real tau", real["tau"], "acceptance", real["acceptance_by_position"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
