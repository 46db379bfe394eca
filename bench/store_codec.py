"""The hidden-store codec on MoE states (issue 28): stored bytes per token, and the ratio to raw bf16,
of stores written by the extract stage itself (`eyas.extract.stage.run_extract`, HF backend on the CPU)
in every `extract.storage`, for four targets on the same tokenized conversations:

- `smollm2`: the real, trained SmolLM2-135M (a Llama; the figures docs/scale.md used so far);
- `smollm2-random`: SmolLM2's architecture with random weights, drawn by tools/tiny_kimi.py's rule
  (matrices N(0, 0.25 / fan_in), norms 1 + N(0, 0.1^2), embeddings N(0, 1)): what random weights alone
  do to the ratio;
- `deepseek-v3`: tools/tiny_kimi.py's DeepSeek-V3 (MLA, routed + shared experts from layer 1) resized to
  `--moe-hidden` and `--moe-layers`, random weights by the same rule;
- `kimi-k25`: the same language model, tensor for tensor, inside `KimiK25ForConditionalGeneration`,
  its taps resolved from `text_config` as the stage resolves them;
- `deepseek-v3-hW`: the DeepSeek-V3 again at each `--moe-widths` width W (does the ratio move with H?).

Per source: bytes per token stored and per array, the fp8 store's error against the bf16 store (relative
RMS per tap, teacher KL and top-1 agreement through the source's own lm_head), and for the wrapper the
max abs difference of its bf16 rows against the bare language model's, per tap. The trained Kimi-K2.5
states are out of reach offline (no model hub), so random MoE states against random Llama states is the
comparison this can make.

    PYTHONPATH=src nice -n 10 .venv/bin/python bench/store_codec.py --model results/assets/model \\
        --shard results/tokens/eval/shard-00000.zarr --work /tmp/store-codec \\
        --out bench/results/store-codec-moe-cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import tiny_kimi  # noqa: E402

from eyas.config import ExtractSettings, SglangSettings  # noqa: E402
from eyas.extract.stage import run_extract  # noqa: E402
from eyas.model.target import load_embed_and_head, read_config  # noqa: E402
from eyas.store import HiddenStore, read_token_shard  # noqa: E402
from eyas.store.quant import STORAGES  # noqa: E402
from eyas.validate import chunk_summary  # noqa: E402

SOURCES = ("smollm2", "smollm2-random", "deepseek-v3", "kimi-k25")
ARRAYS = ("aux", "final", "scale")


# --------------------------------------------------------------------------- the four model dirs
def random_like(model_dir: Path, out: Path, seed: int = 0) -> Path:
    """`model_dir`'s architecture and tokenizer with random weights (tiny_kimi's rule), as an HF dir."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        shapes = {k: t.shape for k, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):  # [H]
            t = 1 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("embed_tokens.weight"):  # [V, H]
            t = torch.randn(shape, generator=gen)
        else:  # [out, in]
            t = torch.randn(shape, generator=gen) * 0.5 * shape[-1] ** -0.5
        tensors[name] = t.to(torch.bfloat16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), {"format": "pt"})
    for f in model_dir.iterdir():  # config and tokenizer files
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".gguf")):
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(
        json.dumps(read_config(model_dir) | {"torch_dtype": "bfloat16"}, indent=2) + "\n"
    )
    return out


def moe_text_config(hidden: int, layers: int) -> dict:
    """tiny_kimi's DeepSeek-V3 at another width and depth; MLP widths keep its proportions (2H dense,
    H/2 per expert), the MLA dims stay Kimi-K2's."""
    return tiny_kimi.TEXT_CONFIG | {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "moe_intermediate_size": hidden // 2,
        "num_hidden_layers": layers,
    }


def model_dirs(args) -> dict[str, Path]:
    """Source name -> model dir: the chosen SOURCES, then the DeepSeek-V3 at each `--moe-widths` width."""
    text = moe_text_config(args.moe_hidden, args.moe_layers)
    models = args.work / "models"
    makers = {
        "smollm2": lambda: args.model,
        "smollm2-random": lambda: random_like(args.model, models / "smollm2-random"),
        "deepseek-v3": lambda: tiny_kimi.write_language_model(models / "deepseek_v3", text_config=text),
        "kimi-k25": lambda: tiny_kimi.write_kimi_k25(models / "kimi_k25", text_config=text),
    }
    dirs = {name: Path(makers[name]()) for name in args.sources}
    for width in args.moe_widths:  # the same family at other widths: does the ratio move with H?
        resized = moe_text_config(width, args.moe_layers)
        name = f"deepseek-v3-h{width}"
        dirs[name] = tiny_kimi.write_language_model(models / name, text_config=resized)
    return dirs


# --------------------------------------------------------------------------- measurements
def array_bytes(store: Path) -> dict[str, int]:
    """Bytes on disk of each array the store has (its chunk files and metadata)."""
    return {
        name: chunk_summary(store, name, hash_bytes=False)["bytes"]
        for name in ARRAYS
        if (store / name).exists()
    }


def extract(name: str, model_dir: Path, storage: str, args) -> dict:
    store = args.work / "stores" / f"{name}-{storage}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    settings = ExtractSettings(device="cpu", storage=storage)
    stats = run_extract(
        args.shard,
        store,
        model_dir,
        settings,
        engine_settings=SglangSettings(),
        aux_layer_ids=None,
        model_id=name,
        trust_remote_code=False,
        threads=args.threads,
    )
    attrs = HiddenStore(store).attrs
    tokens, groups, hidden = stats["tokens"], attrs["num_taps"] + 1, attrs["hidden_size"]
    per_array = array_bytes(store)
    row = {
        "storage": storage,
        "store": str(store),
        "tokens": tokens,
        "samples": stats["samples"],
        "hidden_size": hidden,
        "groups": groups,
        "layer_ids": attrs["layer_ids"],
        "model_architecture": attrs["model_architecture"],
        "text_model_type": attrs["text_model_type"],
        "bytes_stored": stats["bytes_stored"],
        "bytes_raw_bf16": stats["bytes_raw_bf16"],
        "bytes_per_token": stats["bytes_per_token"],
        "ratio_raw_bf16_over_stored": stats["compression_ratio"],
        "fraction_of_raw_bf16": stats["bytes_stored"] / stats["bytes_raw_bf16"],
        "bytes_per_token_by_array": {k: v / tokens for k, v in per_array.items()},
        "ratio_by_array": {  # raw bf16 of the array's rows over its stored bytes (scale: none)
            "aux": tokens * (groups - 1) * hidden * 2 / per_array["aux"],
            "final": tokens * hidden * 2 / per_array["final"],
        },
        "extract_seconds": stats["seconds"],
    }
    return row


def tap_rows(store: HiddenStore, index: int) -> torch.Tensor:
    """Sample `index` as float32 [T, K+1, H]: the taps in layer_ids order, then the final state."""
    aux, final = store.sample(index)
    taps = store.attrs["num_taps"]
    return torch.cat([aux.float().view(len(aux), taps, -1), final.float()[:, None]], dim=1)


def fp8_error(exact: Path, lossy: Path, model_dir: Path, teacher: bool) -> dict:
    """The fp8 store against the bf16 store of the same run: relative RMS error per tap and, for a
    trained model (`teacher`), the teacher distribution (final state through its lm_head) KL(bf16 || fp8)
    and top-1 agreement. A random head's distributions are one-hot or flat: their KL says nothing."""
    a, b = HiddenStore(exact), HiddenStore(lossy)
    head = load_embed_and_head(model_dir)[1].float() if teacher else None  # [V, H]
    num = den = 0
    kl, agree, count = 0.0, 0, 0
    for s in range(a.num_samples):
        x, y = tap_rows(a, s), tap_rows(b, s)  # [T, K+1, H]
        num = num + ((y - x) ** 2).sum(dim=(0, 2)).double()
        den = den + (x**2).sum(dim=(0, 2)).double()
        count += len(x)
        if teacher:
            p, q = (x[:, -1] @ head.T).log_softmax(-1), (y[:, -1] @ head.T).log_softmax(-1)  # [T, V]
            kl += float((p.exp() * (p - q)).sum())
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
    return {
        "relative_rms_error_per_tap": (num / den).sqrt().tolist(),
        "teacher_kl_mean": kl / count if teacher else None,
        "teacher_top1_agreement": agree / count if teacher else None,
        "tokens": count,
    }


def max_abs_difference(first: Path, second: Path) -> dict:
    """Per tap (then the final state), the max abs difference of two stores' rows, over every token."""
    a, b = HiddenStore(first), HiddenStore(second)
    if not np.array_equal(a.sample_offsets, b.sample_offsets):
        raise ValueError(f"{first} and {second} hold different samples")
    worst = torch.zeros(a.attrs["num_taps"] + 1, dtype=torch.float64)
    for s in range(a.num_samples):
        diff = (tap_rows(a, s) - tap_rows(b, s)).abs().amax(dim=(0, 2)).double()  # [K+1]
        worst = torch.maximum(worst, diff)
    return {
        "stores": [str(first), str(second)],
        "groups": [*(f"layer{v}" for v in a.attrs["layer_ids"]), "final"],
        "max_abs_difference": worst.tolist(),
        "rows_compared": int(a.sample_offsets[-1]),
    }


def at_scale(row: dict, hidden: int, groups: int, tokens: float) -> dict:
    """This row's measured fraction of raw bf16 applied to another shape (docs/scale.md's arithmetic)."""
    per_token = groups * hidden * 2 * row["fraction_of_raw_bf16"]
    return {"bytes_per_token": per_token, "store_gb": per_token * tokens / 1e9}


# --------------------------------------------------------------------------- orchestration
def versions() -> dict:
    import numcodecs
    import transformers
    import zarr

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "zarr": zarr.__version__,
        "numcodecs": numcodecs.__version__,
        "git_commit": commit.stdout.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="the real SmolLM2 dir (results/assets/model)"
    )
    parser.add_argument("--shard", type=Path, required=True, help="a token shard of the default job")
    parser.add_argument("--work", type=Path, required=True, help="model dirs and stores go here")
    parser.add_argument("--out", type=Path, help="the results JSON")
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    parser.add_argument("--moe-hidden", type=int, default=1024)
    parser.add_argument("--moe-layers", type=int, default=8)
    parser.add_argument("--moe-widths", type=int, nargs="*", default=[256, 576],
                        help="the DeepSeek-V3 again at these widths (576: SmolLM2's)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scale", type=float, nargs=3, default=[7168, 4, 17.3e6],
                        metavar=("HIDDEN", "GROUPS", "TOKENS"), help="docs/scale.md's case")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    dirs = model_dirs(args)
    hidden, groups, tokens = int(args.scale[0]), int(args.scale[1]), args.scale[2]
    sources = {}
    for name, model_dir in dirs.items():
        rows = {s: extract(name, model_dir, s, args) for s in STORAGES}
        for row in rows.values():
            row["at_scale"] = at_scale(row, hidden, groups, tokens)
        sources[name] = {"model_dir": str(model_dir), "storages": rows}
        stores = rows["bf16"]["store"], rows["fp8_e4m3"]["store"]
        sources[name]["fp8_error"] = fp8_error(*stores, model_dir, teacher=name == "smollm2")
        for s, row in rows.items():
            ratio = row["ratio_raw_bf16_over_stored"]
            print(f"{name:15} {s:9} {row['bytes_per_token']:9.0f} B/tok  ratio {ratio:.3f}")
    report = {
        "command": " ".join(["python", *sys.argv]),
        "cwd": str(Path.cwd()),
        "versions": versions(),
        "threads": args.threads,
        "shard": str(args.shard),
        "shard_tokens": int(read_token_shard(args.shard).sample_offsets[-1]),
        "moe_text_config": moe_text_config(args.moe_hidden, args.moe_layers),
        "scale": {"hidden_size": hidden, "groups": groups, "tokens": tokens},
        "sources": sources,
        "seconds": time.perf_counter() - start,
    }
    if {"deepseek-v3", "kimi-k25"} <= set(sources):
        bare, wrapped = (sources[n]["storages"]["bf16"]["store"] for n in ("deepseek-v3", "kimi-k25"))
        report["wrapper_vs_language_model_bf16"] = diff = max_abs_difference(bare, wrapped)
        print("kimi-k25 vs deepseek-v3, max abs difference per tap:", diff["max_abs_difference"])
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
