#!/usr/bin/env bash
# The GPU recipe (config/gpu-smollm2.yaml) through Snakemake on a lent H200 (no network there), in
# steps that fit the device calls (bench/README.md, "GPU recipe"):
#
#   bash bench/gpu/recipe_device.sh site                 # carried .sgls (sglang 0.5.17 site)
#   bash bench/gpu/recipe_device.sh part1                # carried .dev/p1 (first half of the SmolLM2 GGUF), .smk
#   bash bench/gpu/recipe_device.sh model                # carried .dev/p2, .whl: the HF dir /root/smollm2
#   bash bench/gpu/recipe_device.sh start RUN [snakemake args...]   # Snakemake in the background, in RUN
#                                              (EXTRA_CONFIG="regenerate={enabled: false}": more --config)
#   bash bench/gpu/recipe_device.sh wait RUN SECONDS OUT            # until it ends or SECONDS pass; copies
#                                                               # RUN's small results to OUT
#   bash bench/gpu/recipe_device.sh sweep PLAN [AFTER_RUN]          # bench/studies/recipe_sweep.py in the background
#                                              (with AFTER_RUN: once that run's Snakemake finished)
#   bash bench/gpu/recipe_device.sh waitsweep SECONDS OUT           # until it ends; its JSON and log to OUT
#
# .smk/smk.tar.xz: snakemake 9.27.1 and the dependencies the GPU image lacks, installed for Python 3.12
# (pulp's bundled CBC binaries left out: runs use --scheduler greedy). .devdata: the five llamafactory
# demo files and HumanEval, fetched here by the pipeline's own rules (results/assets/{data,eval}).
# The tree is copied to /root/eyas when the first run starts, so later calls' copies of it do not touch it.
set -euo pipefail
export PYTHONPATH="/root/eyas/src:/tmp/site:/tmp/smk" SGLANG_ENABLE_JIT_DEEPGEMM=0 PYTHONUNBUFFERED=1
export GIT_PYTHON_REFRESH=quiet  # GitPython (imported by Snakemake) must not need a git binary
step=$1; shift
case $step in
  site)
    mkdir -p /tmp/site
    tar -xJf .sgls/site_full.tar.xz -C /tmp/site
    # sglang 0.5.17's EAGLE-3 worker imports deep_gemm while it captures CUDA graphs; with its JIT
    # off an empty module is all that import needs (docs/sglang.md).
    mkdir -p /tmp/site/deep_gemm && touch /tmp/site/deep_gemm/__init__.py
    PYTHONPATH=/tmp/site python3 -c "import sglang; print('sglang', sglang.__version__)"
    ;;
  part1)
    mkdir -p /root/p1 /tmp/smk && cp .dev/p1/* /root/p1/
    tar -xJf .smk/smk.tar.xz -C /tmp/smk
    PYTHONPATH=/tmp/site:/tmp/smk python3 -m snakemake --version
    ;;
  model)
    mkdir -p .dev/p1 && cp /root/p1/* .dev/p1/
    . bench/gpu/gpu_setup.sh
    ;;
  start)
    run=$1; shift
    [[ -d /root/eyas ]] || { mkdir -p /root/eyas && cp -r Snakefile config rules scripts src profiles envs report /root/eyas/; }
    mkdir -p "$run/results/assets"
    [[ -d $run/results/assets/data ]] || cp -r .devdata/data .devdata/eval "$run/results/assets/"
    cd "$run"
    # targets and --configfile first: --config takes every word after it
    setsid nohup python3 -m snakemake "$@" -s /root/eyas/Snakefile -d "$run" --cores 16 --scheduler greedy \
      --config "model={source: /root/smollm2}" ${EXTRA_CONFIG:+"$EXTRA_CONFIG"} > "$run/snakemake.out" 2>&1 < /dev/null &
    echo $! > "$run/snakemake.pid"
    sleep 5; tail -5 "$run/snakemake.out"
    ;;
  wait)
    run=$1 seconds=$2 out=$3
    pid=$(cat "$run/snakemake.pid")
    end=$((SECONDS + seconds))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 5; done
    kill -0 "$pid" 2>/dev/null && echo "RUNNING after $seconds s" || echo "FINISHED"
    # a training job still running: three samples of its Python stacks into its log (eyas.core.logs, SIGUSR1)
    for p in $(pgrep -f '\.train\.py' || true); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) == python* ]] || continue
      for _ in 1 2 3; do kill -USR1 "$p" 2>/dev/null || true; sleep 1; done
    done
    grep -E "^rule |steps \(|Error in rule" "$run/snakemake.out" | tail -30 || true
    tail -8 "$run/snakemake.out"
    newest=$(ls -t "$run"/results/logs/*.log "$run"/results/logs/*/*.log 2>/dev/null | head -1 || true)
    [[ -n $newest ]] && { echo "== $newest"; tail -25 "$newest"; }
    cat "$run"/results/logs/train*.log 2>/dev/null | tr '\r' '\n' | grep "eyas.train INFO" | cut -c1-400 | tail -12 || true
    # the small files only (logs, reports, benchmarks, epochs.csv): a drafter or a store would not come back
    cd "$run" && find results snakemake.out -type f -size -4M -not -path '*.zarr/*' -not -name '*.jsonl' \
      -not -path 'results/assets/*' -not -name '*.safetensors' -not -name '*.pt' -print0 |
      tar -czf "$out/$(basename "$run")-results.tgz" --null -T -
    ;;
  waitsweep)
    seconds=$1 out=$2
    pid=$(cat /root/sweep.pid)
    end=$((SECONDS + seconds))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 5; done
    kill -0 "$pid" 2>/dev/null && echo "RUNNING after $seconds s" || echo "FINISHED"
    tail -30 /root/sweep.out
    cp /root/sweep.out /root/sweep-*.json "$out/" 2>/dev/null || true
    ;;
  sweep)
    # AFTER_RUN: start only when that run's Snakemake has ended, and only if it finished every step
    # (so one call can start the pipeline and queue the sweep behind it; later calls only wait)
    plan=$1 after=${2:-}
    cp bench/studies/recipe_sweep.py "$plan" /root/eyas/
    cd /root/eyas
    setsid nohup bash -c '
      after=$1; shift
      if [[ -n $after ]]; then
        while kill -0 "$(cat "$after/snakemake.pid")" 2>/dev/null; do sleep 5; done
        grep -q "(100%) done" "$after/snakemake.out" || { echo "$after: the pipeline did not finish"; exit 1; }
      fi
      exec python3 "$@"' sweep "$after" recipe_sweep.py --plan "$(basename "$plan")" --model /root/smollm2 \
      --out "/root/sweep-$(basename "$plan")" > "/root/sweep.out" 2>&1 < /dev/null &
    echo $! > /root/sweep.pid
    sleep 5; tail -5 /root/sweep.out
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
