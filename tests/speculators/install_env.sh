#!/usr/bin/env bash
# The third test environment: the real speculators 0.9.0 (vLLM's drafter format) importable on CPU, and
# vLLM 0.33.0's config code (not its engine), for tests/speculators/.
#
#   bash tests/speculators/install_env.sh      # creates or refreshes .venv-speculators (idempotent)
#
# Everything comes from tests/speculators/requirements.txt, fully pinned and installed with --no-deps
# (speculators lists torchvision/torchaudio, which it does not import and whose wheels do not match
# the CPU torch; vLLM pins a CUDA torch 2.14.0, of which its config code needs nothing). torch 2.13.0
# CPU: pip takes it from this machine's disk for Python 3.11. ~2.4 GB (vLLM's wheel: 0.9 GB of it).
# A second run with nothing changed returns at once (stamp = hash of the requirements, pyproject.toml
# and this script).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VENV=${SPECULATORS_VENV:-.venv-speculators}
REQS=tests/speculators/requirements.txt
STAMP=$VENV/.installed

want=$(cat "$REQS" pyproject.toml "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    echo "$VENV is up to date"
    exit 0
fi

# speculators 0.9.0 requires Python >= 3.11; the pins are those pip resolved on 3.11.
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
    "speculators.models.eagle3",
    "vllm.transformers_utils.config",
    "transformers.models.llama.modeling_llama",
    "eyas.export",
    "eyas.target",
):
    importlib.import_module(name)
PY

echo "$want" >"$STAMP"
echo "$VENV ready in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
