#!/usr/bin/env bash
# One engine test environment, shared by tests/{sglang,speculators,specforge}/install_env.sh:
#
#   bash tests/engine_venv.sh VENV REQUIREMENTS CALLER MODULE...
#
# Creates or refreshes VENV from REQUIREMENTS, fully pinned and installed with --no-deps (every engine's
# own dependency list drags in GPU packages that the modules we import do not need; each requirements
# file says what it leaves out), then eyas itself (editable, --no-deps), then imports every MODULE, so a
# broken environment fails here and not in a test. Python 3.11 only: the pins are those pip resolved
# there (and sglang 0.5.23's wheel is cp311 only). A second run with nothing changed returns at once:
# the stamp is the hash of REQUIREMENTS, pyproject.toml, this script and CALLER (the module list).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$1 reqs=$2 caller=$3
shift 3
PYTHON=${PYTHON:-python3}
stamp=$venv/.installed

want=$(cat "$reqs" pyproject.toml "$0" "$caller" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    echo "$venv is up to date"
    exit 0
fi

if [[ $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') != 3.11 ]]; then
    echo "$caller: $PYTHON is not Python 3.11 (set PYTHON=...)" >&2
    exit 1
fi

start=$SECONDS
[[ -x $venv/bin/python ]] || "$PYTHON" -m venv "$venv"
"$venv/bin/pip" install -q --no-deps -r "$reqs"
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -W ignore -c '
import importlib
import sys

for name in sys.argv[1:]:
    importlib.import_module(name)
' "$@"

echo "$want" >"$stamp"
echo "$venv ready in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
