#!/usr/bin/env bash
# SpecForge 0.2.0's own EAGLE-3 trainer on eyas stores, on a lent GPU machine (no network), measured,
# and its drafter converted into an eyas drafter dir for eyas's served evaluation (evaluate.baselines).
#
#   bash bench/gpu/specforge_train.sh STORES MODEL OUT
#     STORES  an eyas results root with tokens/train/, hidden/train/ and vocab/draft_vocab.safetensors
#     MODEL   the target's HF dir (the one the stores were extracted from)
#     OUT     where specforge.json (and the logs) are written, e.g. $OUT of the device call
#
# Carry .sfw (SpecForge and the packages its offline trainer imports that the image lacks or has at
# other versions: `bench/README.md`, "SpecForge's own trainer") and .whl (zarr & co. for eyas's export).
# Settings, as environment variables (defaults in brackets; SpecForge's own defaults where eyas has no
# counterpart):
#   EPOCHS [1]  LR [1e-3: eyas's train.lr]  TTT [7]  MAX_LENGTH [2048]  BATCH [1]  MAX_STEPS []
#   WARMUP_RATIO [0.015]  ATTENTION [flex_attention]  SEED [42]  LOG_INTERVAL [50]
#   LOSS_MASK [assistant: SpecForge's own convention; eyas-targets: eyas's loss positions exactly]
#   WORK [/root/specforge]  the dump, run config, checkpoints and DRAFTER [$WORK/drafter] stay there
#   REUSE_DUMP [0]  1: keep $WORK/dump from an earlier call on the same machine (its own LOSS_MASK)
# Off the GPU machine (the CPU smoke run of bench/README.md): SF_PYTHON=.venv-specforge/bin/python uses that
# environment instead of the wheels, PYTHON=.venv/bin/python runs eyas's steps, and CPU_SMOKE=1 adds the
# three CPU-only changes (fsdp_sharding NO_SHARD, attention sdpa, the plain-torch loss).
# Steps: install the wheels (/tmp/sf), `eyas export-specforge`, `eyas specforge-prepare` (draft config,
# vocab mapping, tied-head index, run.yaml), `bench/gpu/specforge_run.py` (SpecForge's `specforge train`
# in-process: wall time, tokens/s, torch.cuda.max_memory_allocated; nvidia-smi polled beside it),
# `eyas import-specforge-drafter`. Everything lands in OUT/specforge.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
STORES=$(realpath "$1") MODEL=$(realpath "$2") OUT=$(mkdir -p "$3" && realpath "$3")
WORK=${WORK:-/root/specforge}
DRAFTER=${DRAFTER:-$WORK/drafter}
LOSS_MASK=${LOSS_MASK:-assistant}
VOCAB=$STORES/vocab/draft_vocab.safetensors
PYTHON=${PYTHON:-python3}
SF=/tmp/sf
mkdir -p "$WORK"
t0=$SECONDS

# 1. Packages. SpecForge's run sees /tmp/sf first (transformers 5.8.1, its pin, over the image's);
#    eyas's own steps run on the image's packages plus zarr & co. from .whl (bench/gpu/gpu_setup.sh).
if [[ -z ${SF_PYTHON:-} ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SF" .sfw/*.whl
  SF_RUN=(env PYTHONPATH="$SF" python3)
else
  SF_RUN=(env PYTHONPATH= "$SF_PYTHON")
fi
if ! PYTHONPATH=/tmp/site "$PYTHON" -c "import zarr" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
EYAS=(env PYTHONPATH="$PWD/src:/tmp/site" "$PYTHON" -m eyas.interop.cli)
cpu=() cpu_loss=()
if [[ ${CPU_SMOKE:-0} == 1 ]]; then
  cpu=(--set fsdp_sharding=NO_SHARD --set attention_backend=sdpa --set dataloader_num_workers=0)
  cpu_loss=(--cpu-reference-loss)
fi

# 2. The stores as SpecForge offline samples, and what SpecForge needs beside them.
s=$SECONDS
if [[ ${REUSE_DUMP:-0} == 1 && -f $WORK/dump/eyas-export.json ]]; then  # a dump of an earlier call
  "$PYTHON" -c "import json, sys; m = json.load(open(sys.argv[1])); print(json.dumps({k: m[k] for k in \
    ('count', 'tokens', 'loss_mask', 'split')}))" "$WORK/dump/eyas-export.json" > "$OUT/export.json"
else
  "${EYAS[@]}" export-specforge "$STORES" "$WORK/dump" --loss-mask "$LOSS_MASK" > "$OUT/export.json"
fi
export_s=$((SECONDS - s))
set_args=(--set "num_epochs=${EPOCHS:-1}" --set "learning_rate=${LR:-1e-3}" --set "ttt_length=${TTT:-7}"
  --set "max_length=${MAX_LENGTH:-2048}" --set "batch_size=${BATCH:-1}" --set "warmup_ratio=${WARMUP_RATIO:-0.015}"
  --set "attention_backend=${ATTENTION:-flex_attention}" --set "seed=${SEED:-42}"
  --set "log_interval=${LOG_INTERVAL:-50}" --set "max_steps=${MAX_STEPS:-null}" "${cpu[@]}")
"${EYAS[@]}" specforge-prepare "$WORK/dump" "$WORK/run" --model "$MODEL" --vocab "$VOCAB" "${set_args[@]}" \
  > "$OUT/prepare.json"
rm -rf "$WORK/run/output"  # a fresh run (SpecForge would otherwise resume nothing but keep old steps)

# 3. SpecForge's trainer, in this process's CUDA context (bench/gpu/specforge_run.py), nvidia-smi beside it.
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$WORK/smi.csv" 2>/dev/null &
smi=$!
s=$SECONDS
set +e
PYTHONUNBUFFERED=1 "${SF_RUN[@]}" bench/gpu/specforge_run.py --config "$WORK/run/run.yaml" \
  --out "$WORK/train.json" "${cpu_loss[@]}" > "$OUT/specforge-train.log" 2>&1
rc=$?
set -e
train_s=$((SECONDS - s))
kill "$smi" 2>/dev/null || true
tail -n 30 "$OUT/specforge-train.log"
if [[ $rc != 0 ]]; then
  echo "specforge_train.sh: SpecForge's trainer failed (rc $rc); see $OUT/specforge-train.log" >&2
  exit "$rc"
fi

# 4. Its checkpoint as an eyas drafter dir (same target, tokenizer, taps and vocab: evaluate.baselines).
"${EYAS[@]}" import-specforge-drafter "$WORK/run/output" "$DRAFTER" --model "$MODEL" --vocab "$VOCAB" \
  --dump "$WORK/dump" > "$OUT/import.json"

"$PYTHON" - "$OUT" "$WORK" "${SF_PYTHON:-$SF}" "$DRAFTER" "$export_s" "$train_s" "$((SECONDS - t0))" "$*" <<'PY'
import json, sys
from importlib.metadata import distributions
out, work, sf, drafter, export_s, train_s, total_s, args = sys.argv[1:]
load = lambda p: json.load(open(p))
train = load(f"{work}/train.json")
smi = [int(x) for x in open(f"{work}/smi.csv").read().split() if x.strip().isdigit()]
prep = load(f"{out}/prepare.json")
import yaml
result = {
    "command": f"bash bench/gpu/specforge_train.sh {args}",
    "run_yaml": yaml.safe_load(open(prep["run_yaml"])),
    "export": load(f"{out}/export.json"),
    "prepare": prep,
    "packages_sf": {d.metadata["Name"]: d.version for d in distributions(path=[sf])} if not sf.endswith("python") else sf,
    "train": {k: v for k, v in train.items() if k != "logged"},
    "logged_last": train["logged"][-1] if train["logged"] else None,
    "logged": train["logged"],
    "nvidia_smi_peak_used_mib": max(smi) if smi else None,
    "import": load(f"{out}/import.json"),
    "drafter": drafter,
    "seconds": {"export": int(export_s), "train_script": int(train_s), "total": int(total_s)},
}
json.dump(result, open(f"{out}/specforge.json", "w"), indent=1)
t = result["train"]
print(json.dumps({"steps": t["steps"], "tokens": t["tokens"], "wall_s": round(t["wall_s"], 1),
                  "tokens_per_s": t["tokens_per_s"], "steady_tokens_per_s": t["steady_tokens_per_s"],
                  "peak_cuda_allocated_gib": t["peak_cuda_allocated_gib"],
                  "nvidia_smi_peak_used_mib": result["nvidia_smi_peak_used_mib"], "drafter": drafter}))
PY
