"""Issue 28 on a GPU: a Kimi-K2.5-style target captured, trained on and served through SGLang, in one command.

    export SGLANG_ENABLE_JIT_DEEPGEMM=0; mkdir -p /tmp/site/deep_gemm && touch /tmp/site/deep_gemm/__init__.py
    PYTHONPATH=$PWD/src:$PWD/tools:/tmp/site python3 bench/gpu/kimi_wrapped.py --out DIR

(sglang 0.5.17 unpacked in /tmp/site as in bench/gpu/served_device.sh; its transformers 5.12.1 has
DeepSeek-V3.)
Steps, each recorded in DIR/kimi_wrapped.json with the command:

1. models: tools/tiny_kimi.py writes a DeepSeek-V3 language model (MLA, 8 routed + 1 shared expert, 8
   layers) and the same model inside `KimiK25ForConditionalGeneration` (nothing downloaded).
2. data: chat-formatted text-only samples (SmolLM2's tokenizer and template) -> token shards, draft vocab.
3. reference: transformers' DeepseekV3ForCausalLM on the bare language model, fp32 and bf16, through eyas's
   HF backend (the bf16 run is the rounding floor a bf16 engine is judged against).
4. capture: eyas's SGLang backend, default taps (from `text_config`), chunked prefill on
   (`--chunk` tokens), through the wrapper and on the bare language model; once more through the wrapper
   unchunked. The engines serve with `enable_multimodal: false`: the wrapper class still runs (its
   forward goes through `general_mm_embed_routine`, tests/sglang/test_kimi_wrapper.py), but SGLang does
   not build a multimodal processor, which needs Kimi's processor code: transformers 5.12.1 (pinned by
   sglang 0.5.17) has no kimi_k25, and Kimi's release ships it as remote code.
5. compare: per tap (aux taps, then the final post-norm state) max abs difference, relative RMS and rows
   compared: (a) wrapped vs bare (expected identical), chunked vs unchunked; (b) each vs the fp32
   reference, beside HF-bf16's own distance to it.
6. provenance: the wrapped store names the wrapper (`model_architecture`) and the language model
   (`text_model_type`, `sglang_model_type`); training on it with the bare model's hash is refused.
7. train + export: `--steps` optimizer steps of the MLA drafter (`train.drafter: auto` picks it for a target
   with `kv_lora_rank`) on the wrapped stores; SGLang export (`Eagle3DeepseekV2ForCausalLM`).
8. serve: the wrapped target in an EAGLE-3 engine with that draft and with an untrained control of the
   same shape (eyas's served evaluation, `evaluate.served.serve_drafters`); tau is meaningless on random
   weights, the untrained control must give tau 1.0, and the engine must start, draft and verify.

The CPU parts (1-3, 5-7) run in tests/test_kimi_wrapped_script.py; only 4 and 8 need the GPU.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tools")]

import tiny_kimi  # noqa: E402

MODEL_ID = "tiny-kimi"
TOPICS = ["rivers", "prime numbers", "bread", "volcanoes", "chess openings", "tides", "the violin", "bees"]
ASKS = [
    "Explain {} to a child.",
    "Write three facts about {}.",
    "Why do people study {}?",
    "Describe {} briefly.",
]


# --------------------------------------------------------------------------- CPU parts
def make_models(out: Path) -> dict[str, Path]:
    return {
        "wrapped": tiny_kimi.write_kimi_k25(out / "kimi_k25"),
        "bare": tiny_kimi.write_language_model(out / "deepseek_v3"),
    }


def make_data(out: Path, model_dir: Path, samples: int, seed: int = 0) -> dict:
    """Token shards (train, held-out) of chat-formatted samples and the draft vocab of the train one."""
    from eyas.core.provenance import chat_template_hash, tokenizer_hash
    from eyas.data.vocab import build_draft_vocab, save_draft_vocab
    from eyas.model.target import load_tokenizer
    from eyas.store import write_token_shard

    tokenizer = load_tokenizer(model_dir)
    rng = np.random.default_rng(seed)
    words = [w for t in TOPICS for w in t.split()] + ["and", "the", "water", "light", "slowly", "because"]
    shards = {}
    for split, n in (("train", samples), ("heldout", max(2, samples // 4))):
        rows, ids = [], []
        for i in range(n):
            ask = ASKS[rng.integers(len(ASKS))].format(TOPICS[rng.integers(len(TOPICS))])
            answer = " ".join(rng.choice(words, size=int(rng.integers(40, 160))))
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": ask}], tokenize=False, add_generation_prompt=True
            )
            full = prompt + answer + "<|im_end|>\n"
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            f = tokenizer(full, add_special_tokens=False)["input_ids"]
            mask = np.r_[np.zeros(len(p)), np.ones(len(f) - len(p))].astype(np.uint8)
            rows.append((np.asarray(f, dtype=np.int32), mask))
            ids.append(f"{split}-{i}")
        attrs = {
            "tokenizer_hash": tokenizer_hash(tokenizer),
            "chat_template_hash": chat_template_hash(tokenizer),
            "split": split,
            "model_id": MODEL_ID,
            "shard": 0,
        }
        shards[split] = str(out / f"{split}-tokens.zarr")
        write_token_shard(shards[split], rows, ids, attrs)
    d2t, t2d, stats = build_draft_vocab([shards["train"]], tiny_kimi.VOCAB, 2048)
    vocab = out / "vocab.safetensors"
    save_draft_vocab(vocab, d2t, t2d, stats, tokenizer_hash=tokenizer_hash(tokenizer))
    return {"shards": shards, "vocab": str(vocab), "tokenizer_hash": tokenizer_hash(tokenizer)}


def taps_of(model_dir: Path) -> list[int]:
    from eyas.core.layer_ids import resolve_aux_layer_ids
    from eyas.model.target import read_config

    return resolve_aux_layer_ids(read_config(model_dir), None)  # default taps, through text_config


def hf_store(shard: str, model_dir: Path, out: str, dtype: str, device: str) -> dict:
    """transformers' forward of `model_dir` over the shard, through eyas's HF backend."""
    from eyas.extract.hf_backend import extract_shard

    return extract_shard(
        shard,
        out,
        str(model_dir),
        layer_ids=taps_of(model_dir),
        device=device,
        dtype=dtype,
        token_budget=4096,
        model_id=MODEL_ID,
        progress=False,
    )


def tap_differences(store: str, reference: str) -> list[dict]:
    """Per tap (aux taps, then final): max abs difference, relative RMS, rows compared."""
    from eyas.store import HiddenStore

    a, b = HiddenStore(store), HiddenStore(reference)
    if list(a.sample_offsets) != list(b.sample_offsets):
        raise ValueError(f"{store} and {reference} hold different samples")
    taps = int(b.attrs["num_taps"]) + 1
    sq, ref_sq, worst, rows = np.zeros(taps), np.zeros(taps), np.zeros(taps), 0
    for i in range(b.num_samples):
        got, want = (
            torch.cat(a.sample(i), dim=1).float(),
            torch.cat(b.sample(i), dim=1).float(),
        )  # [T, (K+1)H]
        n = got.shape[0]
        diff = (got - want).view(n, taps, -1)
        sq += diff.pow(2).sum((0, 2)).double().numpy()
        ref_sq += want.view(n, taps, -1).pow(2).sum((0, 2)).double().numpy()
        worst = np.maximum(worst, diff.abs().amax((0, 2)).numpy()) if n else worst
        rows += n
    names = [f"tap{v}" for v in b.attrs["layer_ids"]] + ["final"]
    return [
        {"tap": name, "max_abs": float(w), "rel_rms": float(np.sqrt(s / r)), "rows": rows}
        for name, s, r, w in zip(names, sq, ref_sq, worst, strict=True)
    ]


def store_provenance(store: str) -> dict:
    from eyas.store import HiddenStore

    attrs = dict(HiddenStore(store).attrs)
    keys = (
        "model_architecture",
        "text_model_type",
        "sglang_model_type",
        "layer_ids",
        "sglang_layer_ids",
        "backend",
        "chunked_prefill_size",
        "model_hash",
    )
    return {k: attrs.get(k) for k in keys}


def expected_provenance(model_dir: Path, data: dict) -> dict:
    from eyas.core.provenance import model_hash

    return {
        "model_hash": model_hash(model_dir),
        "layer_ids": taps_of(model_dir),
        "model_id": MODEL_ID,
        "tokenizer_hash": data["tokenizer_hash"],
    }


def train_and_export(data: dict, stores: dict, model_dir: Path, out: Path, steps: int, device: str) -> dict:
    """`steps` optimizer steps of the drafter `train.drafter: auto` picks, then its SGLang export."""
    from eyas.config import TrainSettings
    from eyas.core.layer_ids import text_model_type
    from eyas.export import export_sglang
    from eyas.model.target import read_config
    from eyas.train.trainer import train

    settings = TrainSettings(
        epochs=100,
        max_steps=steps,
        lr=1e-3,
        warmup_steps=2,
        token_budget=1024,
        ttt_steps=3,
        device=device,
        checkpoint_every=0,
        progress=False,
        select_by_tau=False,
        drafter="auto",
    )
    stats = train(
        settings,
        token_shards=[data["shards"]["train"]],
        hidden_stores=[stores["train"]],
        vocab_path=data["vocab"],
        model_dir=str(model_dir),
        out_dir=str(out / "drafter"),
        log_path=str(out / "train-log.csv"),
        expected_provenance=expected_provenance(model_dir, data),
    )
    export = export_sglang(out / "drafter", out / "export", text_model_type(read_config(model_dir)))
    drafter = json.loads((out / "drafter" / "config.json").read_text())
    return {
        "train": {k: stats.get(k) for k in ("steps", "tokens", "tokens_per_s")},
        "export": export,
        "drafter": {
            k: drafter.get(k)
            for k in (
                "attention",
                "q_lora_rank",
                "kv_lora_rank",
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "v_head_dim",
                "fc_norm",
                "norm_output",
            )
        },
    }


def refused_with_other_hash(data: dict, stores: dict, model_dir: Path, other: Path, out: Path) -> str:
    """Training on `model_dir`'s stores while expecting `other`'s hash is refused; the error message."""
    from eyas.config import TrainSettings
    from eyas.store import ProvenanceError
    from eyas.train.trainer import train

    try:
        train(
            TrainSettings(max_steps=1, device="cpu", progress=False, select_by_tau=False),
            token_shards=[data["shards"]["train"]],
            hidden_stores=[stores["train"]],
            vocab_path=data["vocab"],
            model_dir=str(model_dir),
            out_dir=str(out / "refused"),
            log_path=str(out / "refused.csv"),
            expected_provenance=expected_provenance(other, data),
        )
    except ProvenanceError as err:
        return str(err)
    raise AssertionError("training on stores of another model was not refused")


# --------------------------------------------------------------------------- GPU parts
ENGINE_ARGS = {"enable_multimodal": False}  # why: the module docstring, step 4


def sglang_store(shard: str, model_dir: Path, out: str, chunk: int, attention: str) -> dict:
    from eyas.config import SglangSettings
    from eyas.extract.sglang_backend import extract_shard_sglang

    settings = SglangSettings(
        tp_size=1,
        mem_fraction_static=0.5,
        chunked_prefill_size=chunk,
        attention_backend=attention,
        requests_per_call=1024,
        engine_args=ENGINE_ARGS,
    )
    return extract_shard_sglang(
        shard,
        out,
        str(model_dir),
        layer_ids=taps_of(model_dir),
        model_id=MODEL_ID,
        settings=settings,
        threads=8,
    )


def serving_inputs(out: Path, model_dir: Path, data: dict, attention: str, prompts: int) -> tuple:
    """(prompt sets, drafter exports {trained, untrained}, engine base args) of the served run: the
    held-out prompts (tokens before each answer), the trained export and an untrained control of the
    same shape exported by the same exporter (`evaluate.drafters`)."""
    from eyas.config import SglangSettings
    from eyas.engine.sglang_args import base_engine_args
    from eyas.evaluate.drafters import export_for_serving, load_drafters
    from eyas.store import read_token_shard

    drafters, _, _ = load_drafters(str(out / "drafter"), str(model_dir), None)
    held = read_token_shard(data["shards"]["heldout"])
    sets = {"heldout": []}
    for i in range(min(prompts, held.num_samples)):
        ids, mask = held.sample(i)
        sets["heldout"].append(ids[: int(np.argmax(mask))].tolist())  # the prompt: tokens before the answer
    exports = export_for_serving(drafters, str(out / "export"), str(model_dir), str(out))
    settings = SglangSettings(mem_fraction_static=0.5, attention_backend=attention)
    return sets, exports, base_engine_args(settings, model_dir, "bfloat16", False) | ENGINE_ARGS


def serve(
    out: Path, model_dir: Path, data: dict, attention: str, k: int, prompts: int, new_tokens: int
) -> dict:
    from eyas.evaluate.served import serve_drafters

    sets, exports, base = serving_inputs(out, model_dir, data, attention, prompts)
    record: dict = {}
    served = serve_drafters(
        prompt_sets=sets,
        drafter_exports=exports,
        base_args=base,
        ks=[k],
        max_new_tokens=new_tokens,
        concurrency=4,
        record=record,
        stage="kimi_wrapped serve",
    )
    (out / "served-outputs.json").write_text(json.dumps(record) + "\n")
    report = served["sets"]["heldout"]
    return {
        "engine_args": {a: v for a, v in base.items() if a != "model_path"},
        "tau": {d: report[d][str(k)]["tau"] for d in report},
        "untrained_tau_is_1": report["untrained"][str(k)]["tau"] == 1.0,
        "served": served,
    }


STORES = ("hf-fp32", "hf-bf16", "wrapped", "bare", "wrapped-unchunked")
UNCHUNKED = 8192  # a chunked-prefill size above every sample's length: each prefilled in one piece
CAPTURES = (  # step 4: (store, the step's name, model, chunked prefill on)
    ("wrapped", "capture_wrapped", "wrapped", True),
    ("bare", "capture_bare", "bare", True),
    ("wrapped-unchunked", "capture_unchunked", "wrapped", False),
)


class Steps:
    """The run's record, DIR/kimi_wrapped.json, written again after each timed step."""

    def __init__(self, out: Path):
        self.path = out / "kimi_wrapped.json"
        self.result: dict = {"command": shlex.join([sys.executable, *sys.argv]), "seconds": {}}

    def run(self, name: str, fn, *a):
        start = time.perf_counter()
        value = fn(*a)
        self.result["seconds"][name] = round(time.perf_counter() - start, 1)
        self.write()
        return value

    def write(self) -> None:
        self.path.write_text(json.dumps(self.result, indent=2, default=str) + "\n")


def reference(steps: Steps, shard: str, bare: Path, stores: dict) -> None:
    """Step 3; a transformers that cannot run the reference must not hide the SGLang figures: its error
    is recorded (`reference_error`), not fatal."""
    try:
        steps.run(
            "reference",
            lambda: [
                hf_store(shard, bare, stores[n], d, "cuda")
                for n, d in (("hf-fp32", "float32"), ("hf-bf16", "bfloat16"))
            ],
        )
    except Exception as err:  # noqa: BLE001 (written to the JSON and printed)
        steps.result["reference_error"] = f"{type(err).__name__}: {err}"
        print("reference failed:", steps.result["reference_error"], file=sys.stderr)


def capture(steps: Steps, shard: str, models: dict, stores: dict, chunk: int, attention: str) -> dict:
    """Step 4: the SGLang captures of `CAPTURES`, each a timed step."""
    return {
        name: steps.run(
            step, sglang_store, shard, models[model], stores[name], chunk if chunked else UNCHUNKED, attention
        )
        for name, step, model, chunked in CAPTURES
    }


def compare(stores: dict, with_reference: bool) -> dict:
    """Step 5: (a) wrapped vs bare, chunked vs unchunked; (b) each vs the fp32 reference, if it ran."""
    return {
        "wrapped_vs_bare": tap_differences(stores["wrapped"], stores["bare"]),
        "chunked_vs_unchunked": tap_differences(stores["wrapped"], stores["wrapped-unchunked"]),
        **{
            f"{n}_vs_hf_fp32": tap_differences(stores[n], stores["hf-fp32"])
            for n in ("wrapped", "bare", "hf-bf16")
            if with_reference
        },
        "criterion": "(a) wrapped == bare (max_abs 0 expected); "
        "(b) rel_rms vs fp32 of the order of hf-bf16's",
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64, help="chunked-prefill size of the chunked captures")
    ap.add_argument("--attention", default="triton", help="SGLang attention backend (MLA: triton)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps of the MLA drafter")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    steps = Steps(out)
    result = steps.result
    models = steps.run("models", make_models, out / "models")
    data = steps.run("data", make_data, out, models["wrapped"], args.samples)
    shard = data["shards"]["train"]
    stores = {name: str(out / f"{name}.zarr") for name in STORES}
    reference(steps, shard, models["bare"], stores)
    import sglang

    result["sglang_version"] = sglang.__version__
    result["capture"] = capture(steps, shard, models, stores, args.chunk, args.attention)
    result["compare"] = compare(stores, "reference_error" not in result)
    result["provenance"] = {n: store_provenance(stores[n]) for n in ("wrapped", "bare")}
    target, train_on = models["wrapped"], {"train": stores["wrapped"]}
    result["provenance_refusal"] = refused_with_other_hash(data, train_on, target, models["bare"], out)
    result["mla_drafter"] = steps.run(
        "train_export", train_and_export, data, train_on, target, out, args.steps, "cuda"
    )
    served = (args.attention, args.k, args.prompts, args.max_new_tokens)
    result["served"] = steps.run("serve", serve, out, target, data, *served)
    steps.write()
    print(json.dumps({"compare": result["compare"], "tau": result["served"]["tau"]}, indent=1))


if __name__ == "__main__":
    main()
