"""Extraction throughput and storage, side by side in one run: (a) pure prefill, (b) eyas extraction
(lossless bf16 and fp8_e4m3), (c) a per-sample `torch.save` baseline in SpecForge's offline format.

    python bench/extract.py --model llama-8b --device cuda --tokens 600000 --budget 32768 --threads 16
    python bench/extract.py --model results/assets/model --shard results/tokens/train/shard-00000.zarr \\
        --device cpu --threads 2 --budget 8192

`--model` is a Hugging Face model dir (real weights) or a Llama shape with random weights
(`llama-1b`, `llama-8b`: throughput only; random states say nothing about compression). Each variant
runs in its own process (so its peak RSS is its own) over the same batch plan, after one warm-up
batch. Token ids come from `--shard` (real tokenized data, repeated up to `--tokens`) or, for random
models, are uniform with conversation-like lengths (lognormal, mean ~1.7k tokens like the seed job's
17.3M tokens / 10k conversations). Prints a table and writes JSON (with this command line) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eyas.core.layer_ids import default_aux_layer_ids
from eyas.extract import hf_backend
from eyas.extract.hf_backend import batch_input_ids, extraction_stats, plan_shard, run_extraction
from eyas.extract.job import peak_rss_bytes
from eyas.model.capture import TapCapture, base_decoder
from eyas.model.target import load_target
from eyas.store import HiddenStore, TokenShard, read_token_shard

SHAPES = {  # Llama-3.2-1B and Llama-3.1-8B shapes
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256),
}  # fmt: skip
# prefill runs first and last: the GPU's clocks and the page cache warm up over a run, and the ratio
# is taken against the faster of the two (the conservative choice).
VARIANTS = ("prefill", "eyas", "eyas-fp8", "specforge", "prefill")


# --------------------------------------------------------------------------- inputs
def build_model(spec: str, device: str):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if spec not in SHAPES:
        return load_target(spec, dtype, device)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[spec], max_position_embeddings=8192, attn_implementation="sdpa")
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def build_shard(args, vocab_size: int) -> TokenShard:
    rng = np.random.default_rng(0)
    if args.shard:
        real = read_token_shard(args.shard)
        lengths = np.diff(real.sample_offsets)
        pieces, total = [], 0
        while total < args.tokens:  # repeat the real samples up to the token count
            for s in range(real.num_samples):
                pieces.append(real.sample(s)[0])
                total += int(lengths[s])
                if total >= args.tokens:
                    break
    else:
        pieces, total = [], 0
        while total < args.tokens:
            n = int(np.clip(rng.lognormal(np.log(1400), 0.65), 64, 4096))
            pieces.append(rng.integers(0, vocab_size, n, dtype=np.int32))
            total += n
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    ids = np.concatenate(pieces).astype(np.int32)
    return TokenShard(ids, np.ones(len(ids), np.uint8), offsets, {})


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- variants
def run_prefill(model, shard, batches, device) -> float:
    decoder = base_decoder(model)
    start = time.perf_counter()
    with torch.inference_mode():
        for indices in batches:
            ids, _ = batch_input_ids(shard, indices, torch.device(device))
            decoder(input_ids=ids, use_cache=False)
    sync(device)
    return time.perf_counter() - start


def run_specforge(model, shard, plan, device, layer_ids, out: Path) -> float:
    """SpecForge's offline dump: per sample `data_{i}.ckpt` under `rows_{a}-{b}/`, rows padded to the
    batch's longest, int64 ids and mask, blocking `.cpu()` per batch. CRC32 off (it holds
    torch.save to 0.3-0.6 GB/s)."""
    serialization = getattr(torch.utils, "serialization", None)
    if serialization is not None:  # torch >= 2.6
        serialization.config.save.compute_crc32 = False
    decoder = base_decoder(model)
    capture = TapCapture(model, layer_ids, final=True)
    start = time.perf_counter()
    with torch.inference_mode():
        for indices in plan.batches:
            ids, _ = batch_input_ids(shard, indices, torch.device(device))
            decoder(input_ids=ids, use_cache=False)
            taps, final = capture.take()
            aux = torch.cat(taps, dim=-1).to(torch.bfloat16).cpu()  # [B, T, 3H]
            final = final.to(torch.bfloat16).cpu()  # [B, T, H]
            ids_cpu = ids.cpu()
            for row, index in enumerate(indices):
                folder = out / f"rows_{index // 5000 * 5000}-{index // 5000 * 5000 + 5000}"
                folder.mkdir(parents=True, exist_ok=True)
                sample = {
                    "input_ids": ids_cpu[row].clone(),  # [T_pad] int64
                    "loss_mask": torch.ones_like(ids_cpu[row]),
                    "hidden_state": final[row : row + 1].clone(),  # [1, T_pad, H]
                    "aux_hidden_state": aux[row : row + 1].clone(),  # [1, T_pad, 3H]
                }
                torch.save(sample, folder / f"data_{index}.ckpt")
    capture.remove()
    return time.perf_counter() - start


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_variant(args) -> dict:
    torch.set_num_threads(args.threads if args.device == "cpu" else 1)
    model = build_model(args.model, args.device)
    config = model.config
    layer_ids = default_aux_layer_ids(config.num_hidden_layers)
    shard = build_shard(args, config.vocab_size)
    row_bytes = (len(layer_ids) + 1) * config.hidden_size * 2
    if args.window_mib:  # a smaller planning window shows the memory bound on a small shard
        hf_backend.WINDOW_BYTES = args.window_mib << 20
    plan = plan_shard(
        np.diff(shard.sample_offsets).tolist(), args.budget, row_bytes, torch.device(args.device).type
    )
    run_prefill(model, shard, plan.batches[:1], args.device)  # kernels and allocator warmed up
    work = Path(args.workdir) / args.variant
    shutil.rmtree(work, ignore_errors=True)
    hidden, taps = config.hidden_size, len(layer_ids)
    raw = plan.real_tokens * (taps + 1) * hidden * 2
    result = {"variant": args.variant, "tokens": plan.real_tokens, "samples": shard.num_samples}
    if args.variant == "prefill":
        seconds = run_prefill(model, shard, plan.batches, args.device)
        result |= {"seconds": seconds, "bytes_stored": 0}
    elif args.variant == "specforge":
        seconds = run_specforge(model, shard, plan, args.device, layer_ids, work)
        result |= {"seconds": seconds, "bytes_stored": dir_bytes(work)}
    else:
        storage = "fp8_e4m3" if args.variant == "eyas-fp8" else "bf16"
        store = work / "shard-00000.zarr"
        timing = run_extraction(
            model, shard, plan, store, layer_ids=layer_ids, hidden=hidden, attrs={}, storage=storage,
            chunk_tokens=args.chunk_tokens, writer_threads=max(1, args.threads - 1),
        )  # fmt: skip
        seconds = timing["seconds"]
        result |= extraction_stats(plan, store, shard.num_samples, taps, hidden, seconds)
        result["writer_wait_seconds"] = timing["writer_wait_seconds"]
        result["peak_pending_chunks"] = timing["peak_pending_chunks"]
        if args.keep:
            keep = Path(args.workdir) / f"keep-{args.variant}.zarr"
            shutil.rmtree(keep, ignore_errors=True)
            store.rename(keep)
    shutil.rmtree(work, ignore_errors=True)
    result |= {
        "tokens_per_s": plan.real_tokens / seconds,
        "bytes_per_token": result["bytes_stored"] / plan.real_tokens,
        "ratio_to_raw_bf16": result["bytes_stored"] / raw,
        "padding_fraction": plan.padding_fraction,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    return result


# --------------------------------------------------------------------------- fp8 error on real states
def fp8_error(args) -> dict:
    """Compare the kept bf16 and fp8 stores: relative error per tap; teacher KL and top-1 agreement."""
    exact = HiddenStore(Path(args.workdir) / "keep-eyas.zarr")
    lossy = HiddenStore(Path(args.workdir) / "keep-eyas-fp8.zarr")
    head = build_model(args.model, "cpu").lm_head.weight.float()  # [V, H]
    taps = exact.attrs["num_taps"]
    num = np.zeros(taps + 1)
    den = np.zeros(taps + 1)
    kl, agree, count = 0.0, 0, 0
    for s in range(min(exact.num_samples, 64)):
        a, f = (t.float() for t in exact.sample(s))
        b, g = lossy.sample(s)
        x = torch.cat([a.view(len(a), taps, -1), f[:, None]], dim=1)  # [T, K+1, H]
        y = torch.cat([b.view(len(b), taps, -1), g[:, None]], dim=1)
        num += ((y - x) ** 2).sum(dim=(0, 2)).double().numpy()
        den += (x**2).sum(dim=(0, 2)).double().numpy()
        p, q = (f @ head.T).log_softmax(-1), (g @ head.T).log_softmax(-1)  # [T, V]
        kl += float((p.exp() * (p - q)).sum())
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        count += len(f)
    rel = np.sqrt(num / den).tolist()
    return {
        "relative_error_per_tap": rel,
        "teacher_kl_mean": kl / count,
        "teacher_top1_agreement": agree / count,
    }


# --------------------------------------------------------------------------- orchestration
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shard", help="a token shard whose samples are repeated up to --tokens")
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--budget", type=int, default=16384, help="padded tokens per forward batch")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--window-mib", type=int, default=None, help="planning window (default: the stage's)")
    parser.add_argument("--workdir", default=None, help="where stores are written (default: a temp dir)")
    parser.add_argument("--out", default=None, help="JSON results file")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fp8-error", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(run_variant(args)), flush=True)
        return
    if args.fp8_error:
        print("RESULT " + json.dumps(fp8_error(args)), flush=True)
        return

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="eyas-bench-"))
    real = args.model not in SHAPES
    results = []
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--variant", variant, "--workdir", str(workdir)]
        if real and variant.startswith("eyas"):
            cmd.append("--keep")
        result = _child(cmd)
        repeats = sum(r["variant"].split("#")[0] == variant for r in results)
        result["variant"] = f"{variant}#{repeats + 1}" if repeats else variant
        results.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
    report = {
        "command": " ".join(["python", "bench/extract.py", *sys.argv[1:]]),
        "device": _device_name(args),
    }
    report["results"] = results
    by = {r["variant"]: r for r in results}
    if "prefill" in by:
        report["ratio_to_prefill"] = {
            v: r["tokens_per_s"] / by["prefill"]["tokens_per_s"] for v, r in by.items()
        }
    if real and {"eyas", "eyas-fp8"} <= set(by):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--fp8-error", "--workdir", str(workdir)]
        report["fp8_error"] = _child(cmd)
    shutil.rmtree(workdir, ignore_errors=True)
    _print_table(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


def _child(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench child failed ({proc.returncode}): {' '.join(cmd)}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _device_name(args) -> str:
    if args.device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu x{args.threads} ({os.cpu_count()} cores visible)"


def _print_table(report: dict) -> None:
    print(f"\n{report['command']}\n{report['device']}")
    header = ("variant", "tok/s", "x prefill", "B/token", "x raw", "pad", "RSS GiB")
    print(f"{header[0]:<10} " + " ".join(f"{h:>9}" for h in header[1:]))
    for r in report["results"]:
        ratio = report.get("ratio_to_prefill", {}).get(r["variant"], float("nan"))
        rss = r["peak_rss_bytes"] / 2**30
        pad = r["padding_fraction"]
        cells = (r["tokens_per_s"], ratio, r["bytes_per_token"], r["ratio_to_raw_bf16"], pad, rss)
        formats = (".0f", ".3f", ".0f", ".3f", ".3f", ".2f")
        print(f"{r['variant']:<10} " + " ".join(f"{c:>9{f}}" for c, f in zip(cells, formats, strict=True)))
    if "fp8_error" in report:
        print("fp8:", json.dumps(report["fp8_error"]))


if __name__ == "__main__":
    main()
