#!/usr/bin/env bash
# The third test environment: the real speculators 0.9.0 (vLLM's drafter format) importable on CPU, and
# vLLM 0.33.0's config code (not its engine), for tests/speculators/.
#
#   bash tests/speculators/install_env.sh      # creates or refreshes .venv-speculators (idempotent)
#
# speculators lists torchvision/torchaudio, which it does not import and whose wheels do not match the
# CPU torch; vLLM pins a CUDA torch 2.14.0, of which its config code needs nothing: so
# tests/speculators/requirements.txt, installed with --no-deps. torch 2.13.0 CPU: pip takes it from this
# machine's disk for Python 3.11. ~2.4 GB (vLLM's wheel: 0.9 GB of it). How: tests/engine_venv.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash tests/engine_venv.sh "${SPECULATORS_VENV:-.venv-speculators}" tests/speculators/requirements.txt \
    tests/speculators/install_env.sh \
    speculators.models.eagle3 \
    vllm.transformers_utils.config \
    transformers.models.llama.modeling_llama \
    eyas.export \
    eyas.model.target
