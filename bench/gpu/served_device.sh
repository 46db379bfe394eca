#!/usr/bin/env bash
# The served-evaluation and regeneration measurements of bench/README.md on a lent H200, after
# bench/gpu/gpu_setup.sh (SmolLM2 in /root/smollm2, the drafter in /root/drafter) and with sglang 0.5.17
# unpacked in /tmp/site (the recipe of docs/sglang.md: triton attention, pytorch sampling, no FA3).
#
#   bash bench/gpu/served_device.sh OUT_DIR [served|regenerate|hf]...
#
# Carried: .dev/run/export (results/export/sglang) and .dev/run/data (eval.jsonl, humaneval.jsonl, and a
# prepared split of >= 1,000 conversations, all_train.jsonl).
set -euo pipefail
out=$1; shift
export SGLANG_ENABLE_JIT_DEEPGEMM=0 PYTHONUNBUFFERED=1
# sglang 0.5.17's EAGLE-3 worker imports deep_gemm while it captures CUDA graphs; the slim kernel
# package has none, and with its JIT off an empty module is all that import needs.
mkdir -p /tmp/site/deep_gemm && touch /tmp/site/deep_gemm/__init__.py
data=.dev/run/data
sgl_env=(env PYTHONPATH="$PWD/src:/tmp/site")
for step in "$@"; do
  case $step in
    served)
      "${sgl_env[@]}" python3 bench/served.py --model /root/smollm2 --drafter /root/drafter \
        --export .dev/run/export --set heldout=$data/eval.jsonl --set humaneval=$data/humaneval.jsonl \
        --k 3 4 5 --num-prompts 16 --max-new-tokens 96 --concurrency 8 --attention-backend triton \
        --engine-arg sampling_backend='"pytorch"' --out "$out/served-h200-smollm2.json" \
        --record "$out/served-outputs.json" ;;
    regenerate)
      "${sgl_env[@]}" python3 bench/regenerate.py --model /root/smollm2 --conversations $data/all_train.jsonl \
        --max-new-tokens 128 --hf-batch-size 64 --attention-backend triton --sampling-backend pytorch \
        --out "$out/regenerate-h200-smollm2.json" ;;
    hf)  # the HF reference loop (fp32) on the same prompts at k = 4, with the image's transformers
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/eyasdeps .whl/*.whl
      PYTHONPATH="$PWD/src:/tmp/eyasdeps" python3 bench/evaluate_gpu.py --model /root/smollm2 \
        --drafter /root/drafter --set heldout=$data/eval.jsonl --set humaneval=$data/humaneval.jsonl \
        --num-prompts 16 --max-new-tokens 96 --k 4 --no-untrained --out "$out/served-hf-reference-k4.json" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
