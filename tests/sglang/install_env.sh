#!/usr/bin/env bash
# The second test environment: a real sglang 0.5.23 importable on CPU, for tests/sglang/.
#
#   bash tests/sglang/install_env.sh      # creates or refreshes .venv-sglang (idempotent)
#
# Everything comes from tests/sglang/requirements.txt, fully pinned and installed with --no-deps:
# sglang's own dependency list drags in GPU kernels (sglang-kernel, flashinfer, deep-gemm, ...) that
# its modules do not need to import; the file holds only what the import loop found they need.
# torch 2.14.1 + torchvision 0.29.1 (a CUDA build: ~5.5 GB of the venv) are what sglang 0.5.23 pins;
# on this machine pip takes both from local disk for Python 3.11. A second run with nothing changed
# returns at once (stamp = hash of the requirements, pyproject.toml and this script).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.venv-sglang}
REQS=tests/sglang/requirements.txt
STAMP=$VENV/.installed

want=$(cat "$REQS" pyproject.toml "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    echo "$VENV is up to date"
    exit 0
fi

# The sglang 0.5.23 wheel is cp311 only.
if [[ $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') != 3.11 ]]; then
    echo "install_env.sh: $PYTHON is not Python 3.11 (set PYTHON=...)" >&2
    exit 1
fi

start=$SECONDS
[[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --no-deps -r "$REQS"
"$VENV/bin/pip" install -q --no-deps -e .

# Fail here, not in a test, when a module the backend needs no longer imports.
"$VENV/bin/python" -W ignore - <<'EOF'
import importlib

for name in (
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.server_args",
    "sglang.srt.plugins.hook_registry",
    "eyas.store",
    "eyas.extract.writer",
):
    importlib.import_module(name)
EOF

echo "$want" >"$STAMP"
echo "$VENV ready in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
