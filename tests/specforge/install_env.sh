#!/usr/bin/env bash
# The fourth test environment: the real SpecForge 0.2.0 (PyPI `specforge`) importable on CPU, for
# tests/specforge/ and the CPU smoke run of bench/gpu/specforge_train.sh (bench/README.md).
#
#   bash tests/specforge/install_env.sh      # creates or refreshes .venv-specforge (idempotent)
#
# SpecForge pins sglang, wandb and a CUDA torch, none of which its offline trainer imports:
# tests/specforge/requirements.txt says what stands in for what, installed with --no-deps. ~2.1 GB,
# ~3 min the first time. How it installs: tests/engine_venv.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash tests/engine_venv.sh "${SPECFORGE_VENV:-.venv-specforge}" tests/specforge/requirements.txt \
    tests/specforge/install_env.sh \
    specforge.cli \
    specforge.training.assembly \
    specforge.launch \
    specforge.algorithms.eagle3.model \
    specforge.data.utils \
    eyas.interop.specforge_export \
    eyas.interop.specforge_train
