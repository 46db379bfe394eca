"""Train-stage bench: trainer tokens/s and peak memory, loader feed rate vs trainer consumption, and
peak memory of one long sample at the 8B shape.

    .venv/bin/python bench/train.py --out bench/results/train_cpu.json               # CPU part
    python bench/train.py --device cuda --out bench/results/train_h200.json          # on a GPU host

Every case runs in a fresh subprocess, so its peak memory is its own: on CUDA
`torch.cuda.max_memory_allocated`, on CPU the process's peak RSS (`ru_maxrss`, which includes the
~0.3-0.5 GB of the imported libraries; `baseline` reports that floor). Trainer cases are real
`step.train_step` calls (teacher in-vocab argmax, TTT unroll, chunked loss, backward, AdamW step)
on synthetic batches; the loader case reads real zarr stores written with the extract stage's codec
(random bf16 states: they compress worse than real ones, so decoding is if anything slower).
Prints a table and writes JSON (with the command line) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from child import run_in_child

# Positions that carry loss in a real batch: the recipe's demo run trained 3,471,023 of its 4,450,497
# tokens (0.78; responses, not prompts) and its draft vocab covered 99.8% of them (steps-sweep result's
# `train_split`). Synthetic batches train that share, and their teacher's greedy token lies in the draft
# vocab: with all-ones masks and a random teacher only ~1/3 of the positions carried loss, which made a
# step look cheaper than a real one (the loss's [N, D] work scales with its N rows).
TRAINED_SHARE = 0.78

SHAPES = {  # drafter shapes: (hidden, intermediate, heads, kv heads, head_dim, vocab, draft vocab)
    "smollm2": dict(hidden=576, inter=1536, heads=9, kv=3, head_dim=64, vocab=49152, draft=8192),
    "8b": dict(hidden=4096, inter=14336, heads=32, kv=8, head_dim=128, vocab=128256, draft=32000),
}


# --------------------------------------------------------------------------- cases (run in a child)
def _drafter(shape: dict, device: torch.device):
    from eyas.model.drafter import DrafterConfig, Eagle3Drafter

    cfg = DrafterConfig(
        hidden_size=shape["hidden"],
        intermediate_size=shape["inter"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        head_dim=shape["head_dim"],
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        vocab_size=shape["vocab"],
        draft_vocab_size=shape["draft"],
        aux_layer_ids=[1, 2, 3],
    )
    torch.manual_seed(0)
    return Eagle3Drafter(cfg).to(device).train()


def _batch(shape: dict, rows: int, length: int, device: torch.device, trained_share: float = TRAINED_SHARE):
    """A synthetic [rows, length] batch whose last `trained_share` of each row is trained (the response)."""
    from eyas.train.loader import Batch

    h = shape["hidden"]
    g = torch.Generator().manual_seed(1)
    loss_mask = torch.zeros(rows, length, dtype=torch.int64)
    loss_mask[:, round(length * (1 - trained_share)) :] = 1
    return Batch(  # hidden states in bf16, as the loader hands them over from a bf16 store
        aux=torch.randn(rows, length, 3 * h, generator=g).bfloat16(),
        final=torch.randn(rows, length, h, generator=g).bfloat16(),
        input_ids=torch.randint(0, shape["vocab"], (rows, length), generator=g),
        loss_mask=loss_mask,
        valid=torch.ones(rows, length, dtype=torch.bool),
        lengths=torch.full((rows,), length),
    )


def synthetic_teacher(shape: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random target lm_head [V, H] whose greedy token for a random state lies in the draft vocab (its
    first D ids: the rows scaled up), d2t [D] and t2d [V] of that vocab."""
    head = torch.randn(shape["vocab"], shape["hidden"]) * 0.02
    head[: shape["draft"]] *= 1.5
    d2t = torch.zeros(shape["draft"], dtype=torch.int64)
    t2d = torch.zeros(shape["vocab"], dtype=torch.bool)
    t2d[: shape["draft"]] = True
    return head, d2t, t2d


def trainer_step(
    shape: dict,
    rows: int,
    length: int,
    device: torch.device,
    ttt: int,
    attention: str = "masked",
    compile_steps: bool = False,
):
    """A function running one real trainer step (`step.train_step`, then AdamW) of the drafter at `shape`
    on one fixed [rows, length] batch (pinned on a GPU, as the loader hands it over), its tree attention
    by `attention` (train.tree_attention: masked | lse), compiled with `compile_steps` (train.compile)."""
    from eyas.config import TrainSettings
    from eyas.train.distributed import World
    from eyas.train.parallel import spread_over_ranks
    from eyas.train.step import Teacher, train_step
    from eyas.train.trainer import param_groups, resolve_amp

    settings, amp = TrainSettings(ttt_steps=ttt, select_by_tau=False), resolve_amp("auto", device)
    model = _drafter(shape, device)
    model.attention_impl = attention  # as eyas.train.drafter_setup sets it from the settings
    if compile_steps:
        model.compile_steps()
    spread = spread_over_ranks(model, "ddp", World(), device)
    head, d2t, t2d = synthetic_teacher(shape)
    teacher = Teacher(head, d2t, t2d, device, amp or torch.float32)
    optimizer = torch.optim.AdamW(param_groups(spread.objective, 0.0), lr=1e-4)
    batch = _batch(shape, rows, length, device)
    batch = batch.pin() if device.type == "cuda" else batch

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        train_step(spread, teacher, [batch], settings, amp, device)
        optimizer.step()

    return step


def case_train(shape_name: str, rows: int, length: int, steps: int, device_name: str, ttt: int) -> dict:
    """Trainer steps on [rows, length] batches: tokens/s and peak memory."""
    from eyas.model.drafter import mlp_recompute_needed
    from eyas.train.step import activation_budget
    from eyas.train.trainer import resolve_amp

    device = torch.device(device_name)
    shape = SHAPES[shape_name]
    step = trainer_step(shape, rows, length, device, ttt)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 1):  # step 0 is warm-up (allocator, kernels)
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        if i:
            times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    elsize = 2 if resolve_amp("auto", device) is not None else 4
    return {
        "mlp_recompute": mlp_recompute_needed(
            rows * length, shape["inter"], ttt, elsize, activation_budget(device)
        ),
        "tokens_per_step": rows * length,
        "seconds_per_step": seconds,
        "tokens_per_s": rows * length / seconds,
        **peak(device),
    }


def bench_token_shard(path: Path, lengths, vocab: int, rng: np.random.Generator, layer_ids: list[int]):
    """A token shard of random tokens, one sample per length, written at `path` (every token in the
    loss), and the provenance attrs a hidden store of it carries (model_hash "m"): (shard, attrs)."""
    from eyas.core.layer_ids import LAYER_ID_CONVENTION
    from eyas.core.provenance import sha256_array
    from eyas.store import read_token_shard, write_token_shard

    prov = {"model_id": "bench", "tokenizer_hash": "t", "chat_template_hash": "c"}
    data = [(rng.integers(0, vocab, int(n)).astype(np.int32), np.ones(int(n), np.uint8)) for n in lengths]
    write_token_shard(path, data, [f"s{i}" for i in range(len(lengths))], prov)
    shard = read_token_shard(path)
    attrs = {
        **prov,
        "model_hash": "m",
        "layer_ids": list(layer_ids),
        "layer_id_convention": LAYER_ID_CONVENTION,
        "tokens_checksum": sha256_array(shard.input_ids),
    }
    return shard, attrs


def case_loader(shape_name: str, samples: int, length: int, budget: int, readers: int, pin: bool) -> dict:
    """Read rate of PairedLoader (reader threads, zarr + Blosc decode, pinning as the trainer on a GPU
    asks) over real stores on disk."""
    from eyas.store import bf16_to_uint16, hidden_store_writer
    from eyas.train.loader import PairedLoader

    shape = SHAPES[shape_name]
    h = shape["hidden"]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="eyas-bench-") as tmp:
        tok, hid = Path(tmp) / "tok.zarr", Path(tmp) / "hid.zarr"
        lengths = rng.integers(length // 2, length + 1, samples)
        shard, attrs = bench_token_shard(tok, lengths, shape["vocab"], rng, [1, 2, 3])
        with hidden_store_writer(hid, shard.sample_offsets, h, 3, attrs) as writer:
            for s, n in enumerate(lengths):
                aux = torch.randn(int(n), 3 * h) * 2.0  # realistic magnitudes; mantissa bits are noise
                writer.write_sample(s, bf16_to_uint16(aux), bf16_to_uint16(torch.randn(int(n), h)))
        os.sync()
        loader = PairedLoader(
            [str(tok)], [str(hid)], budget, 0, {"model_hash": "m"}, pin_memory=pin, readers=readers
        )
        plan = loader.plan(0)
        start = time.perf_counter()
        tokens = sum(b.num_tokens for b in loader.batches(plan))
        seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "batches": len(plan)}


def case_baseline(device_name: str) -> dict:
    import eyas.train.trainer  # noqa: F401 - what every case imports

    return peak(torch.device(device_name))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_gib": torch.cuda.max_memory_allocated() / 2**30, "peak_kind": "cuda_max_allocated"}
    return {
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "peak_kind": "cpu_max_rss",
    }


# --------------------------------------------------------------------------- parent
def run_case(name: str, threads: int, **kwargs) -> dict:
    """Run one case in a fresh interpreter; an out-of-memory or crash is reported, not hidden."""
    return {"case": name, **kwargs, **run_in_child("train", f"case_{name}", kwargs, threads)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per case")
    ap.add_argument("--steps", type=int, default=3, help="timed trainer steps per case (after 1 warm-up)")
    ap.add_argument("--long", default="8192,32768,65536", help="one-sample lengths at the 8B shape (GPU)")
    ap.add_argument("--readers", default="1,4", help="loader reader threads to compare (comma list)")
    ap.add_argument(
        "--only", default="small,big-train,big-loader,long", help="case groups to run (comma list)"
    )
    args = ap.parse_args()
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    results = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu x{args.threads} threads",
        "torch": torch.__version__,
        "cases": [],
    }
    cases = results["cases"]
    only = set(args.only.split(","))
    cases.append(run_case("baseline", args.threads, device_name=device))
    pin = device == "cuda"
    readers = [int(r) for r in args.readers.split(",")]
    ratios = {}
    train_small = train_big = None

    def loaders(shape_name: str, length: int, budget: int, trainer: dict | None) -> None:
        """Loader cases (48 samples of up to `length` tokens) for each reader count, with their
        feed rate over `trainer`'s consumption when it ran."""
        runs = [
            run_case(
                "loader",
                args.threads,
                shape_name=shape_name,
                samples=48,
                length=length,
                budget=budget,
                readers=r,
                pin=pin,
            )
            for r in readers
        ]
        cases.extend(runs)
        if trainer is not None:
            ratios.update({f"{shape_name} readers={c['readers']}": _ratio(c, trainer) for c in runs})

    # Trainer throughput at the default job's shape (SmolLM2, token_budget 1024 = 1 x 1024) ...
    if "small" in only:
        train_small = run_case(
            "train",
            args.threads,
            shape_name="smollm2",
            rows=1,
            length=1024,
            steps=args.steps,
            device_name=device,
            ttt=7,
        )
        cases.append(train_small)
        loaders("smollm2", 1024, 1024, train_small)
    if device == "cuda":
        # ... and at the 8B shape: throughput at a 16k-token budget, loader rate, long samples.
        if "big-train" in only:
            train_big = run_case(
                "train", args.threads, shape_name="8b", rows=4, length=4096, steps=args.steps,
                device_name=device, ttt=7,
            )  # fmt: skip
            cases.append(train_big)
        if "big-loader" in only:
            loaders("8b", 4096, 16384, train_big)
        if "long" in only:
            for length in (int(x) for x in args.long.split(",")):
                cases.append(
                    run_case(
                        "train",
                        args.threads,
                        shape_name="8b",
                        rows=1,
                        length=length,
                        steps=1,
                        device_name=device,
                        ttt=7,
                    )  # fmt: skip
                )
    results["loader_over_trainer"] = ratios
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)


def _ratio(loader: dict, trainer: dict) -> dict:
    if "tokens_per_s" not in loader or "tokens_per_s" not in trainer:
        return {"ok": None}
    ratio = loader["tokens_per_s"] / trainer["tokens_per_s"]
    return {
        "loader_tok_s": loader["tokens_per_s"],
        "trainer_tok_s": trainer["tokens_per_s"],
        "ratio": ratio,
        "ok": ratio >= 2,
    }


def print_table(results: dict) -> None:
    print(f"# {results['command']}\n# {results['device']}, torch {results['torch']}")
    print(f"{'case':9} {'shape':8} {'rows x T':>12} {'tok/s':>10} {'s/step':>8} {'peak GiB':>9}")
    for c in results["cases"]:
        shape = c.get("shape_name", "-")
        dims = f"{c.get('rows', c.get('samples', '-'))} x {c.get('length', '-')}"
        if "error" in c:
            print(f"{c['case']:9} {shape:8} {dims:>12} {c['error']}: {c['detail']}")
            continue
        tok = f"{c['tokens_per_s']:.0f}" if "tokens_per_s" in c else "-"
        sec = f"{c['seconds_per_step']:.3f}" if "seconds_per_step" in c else "-"
        mem = f"{c['peak_gib']:.2f}" if "peak_gib" in c else "-"
        print(f"{c['case']:9} {shape:8} {dims:>12} {tok:>10} {sec:>8} {mem:>9}")
    for shape, r in results["loader_over_trainer"].items():
        if r.get("ratio") is not None:
            verdict = "ok" if r["ok"] else "LOADER TOO SLOW"
            rates = f"{r['loader_tok_s']:.0f} / {r['trainer_tok_s']:.0f} tok/s"
            print(f"loader/trainer at {shape}: {rates} = {r['ratio']:.1f}x ({verdict})")


if __name__ == "__main__":
    main()
