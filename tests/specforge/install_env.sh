#!/usr/bin/env bash
# The fourth test environment: the real SpecForge 0.2.0 (PyPI `specforge`) importable on CPU, for
# tests/specforge/ and the CPU smoke run of bench/specforge_train.sh (bench/README.md).
#
#   bash tests/specforge/install_env.sh      # creates or refreshes .venv-specforge (idempotent)
#
# Everything comes from tests/specforge/requirements.txt, fully pinned and installed with --no-deps
# (SpecForge pins sglang, wandb and a CUDA torch, none of which its offline trainer imports; the file
# says what stands in for what). ~2.1 GB, ~3 min the first time. A second run with nothing changed
# returns at once (stamp = hash of the requirements, pyproject.toml and this script).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VENV=${SPECFORGE_VENV:-.venv-specforge}
REQS=tests/specforge/requirements.txt
STAMP=$VENV/.installed

want=$(cat "$REQS" pyproject.toml "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    echo "$VENV is up to date"
    exit 0
fi

# specforge 0.2.0 requires Python >= 3.11; the pins are those pip resolved on 3.11.
if [[ $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') != 3.11 ]]; then
    echo "install_env.sh: $PYTHON is not Python 3.11 (set PYTHON=...)" >&2
    exit 1
fi

start=$SECONDS
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps -r "$REQS"
"$VENV/bin/pip" install -q --no-deps -e .

# Fail here, not in a test, when a module the tests need no longer imports.
"$VENV/bin/python" -W ignore - <<'PY'
import importlib

for name in (
    "specforge.cli",
    "specforge.training.assembly",
    "specforge.launch",
    "specforge.algorithms.eagle3.model",
    "specforge.data.utils",
    "eyas.specforge_export",
    "eyas.specforge_train",
):
    importlib.import_module(name)
PY

echo "$want" >"$STAMP"
echo "$VENV ready in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
