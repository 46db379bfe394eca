#!/usr/bin/env bash
# The second test environment: a real sglang 0.5.23 importable on CPU, for tests/sglang/.
#
#   bash tests/sglang/install_env.sh      # creates or refreshes .venv-sglang (idempotent)
#
# tests/sglang/requirements.txt holds only what the import loop found sglang's modules need: its own
# dependency list drags in GPU kernels (sglang-kernel, flashinfer, deep-gemm, ...). torch 2.14.1 +
# torchvision 0.29.1 (a CUDA build: ~5.5 GB of the venv) are what sglang 0.5.23 pins; on this machine
# pip takes both from local disk for Python 3.11. How it installs: tests/engine_venv.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash tests/engine_venv.sh "${SGLANG_VENV:-.venv-sglang}" tests/sglang/requirements.txt \
    tests/sglang/install_env.sh \
    sglang.srt.entrypoints.engine \
    sglang.srt.managers.scheduler \
    sglang.srt.model_executor.model_runner \
    sglang.srt.model_executor.forward_batch_info \
    sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state \
    sglang.srt.layers.logits_processor \
    sglang.srt.server_args \
    sglang.srt.plugins.hook_registry \
    eyas.store \
    eyas.extract.writer
