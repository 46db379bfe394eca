#!/usr/bin/env bash
# Prepare a lent GPU machine (its image has python3 with torch and transformers, no network) for the
# benches: install the wheels carried in .whl (zarr, numcodecs, donfig, google-crc32c, gguf; fetched here
# with `pip download --python-version 3.12 ...`, see the device notes in bench/README.md) and, when the
# SmolLM2 GGUF was carried in pieces (.dev/p1, .dev/p2), reassemble it and convert it to an HF dir.
# Source it:  . bench/gpu/gpu_setup.sh   (exports PYTHONPATH)
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD/src:/tmp/site"
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [[ -d .dev/p1 && -d .dev/p2 && ! -f /root/smollm2/config.json ]]; then
  mkdir -p /root/gguf
  cat .dev/p1/* .dev/p2/* > /root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  echo "$GGUF_SHA256  /root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
  python3 -c "from eyas.assets import gguf_to_hf; gguf_to_hf('/root/gguf/SmolLM2-135M-Instruct.Q4_1.gguf', '/root/smollm2')"
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader || true
# A trained drafter carried without its frozen embedding (.dev/drafter: config, weights minus
# embed_tokens, embed.sha256): the embedding is the target's own, checked by hash, so it need not travel.
if [[ -d .dev/drafter && -f /root/smollm2/config.json && ! -f /root/drafter/config.json ]]; then
  python3 - <<'PY'
import hashlib, os, shutil
from safetensors.torch import load_file, save_file
state = load_file(".dev/drafter/model.safetensors")
embed = load_file("/root/smollm2/model.safetensors")["model.embed_tokens.weight"].float().contiguous()
digest = hashlib.sha256(embed.numpy().tobytes()).hexdigest()
expected = open(".dev/drafter/embed.sha256").read().split()[0]
assert digest == expected, f"target embedding {digest} != the drafter's {expected}"
state["embed_tokens.weight"] = embed
os.makedirs("/root/drafter", exist_ok=True)
save_file(state, "/root/drafter/model.safetensors")
shutil.copy(".dev/drafter/config.json", "/root/drafter/config.json")
PY
fi
