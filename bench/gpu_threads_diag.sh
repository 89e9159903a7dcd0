#!/usr/bin/env bash
# Why a GPU-bound model on 8-16 threads of one process is slower than on 4 (bench_gpu_udf.py,
# torch encoder, inline runner): the same refreshes with the interpreter's thread switch interval
# at 0.5 ms instead of 5 ms, and with one CUDA stream shared by the threads instead of one each.
# For the GPU machine (see gpu_device_run.sh); DRY=1 runs it here with the CPU stand-in.
source "$(dirname "$0")/gpu_env.sh"
export PYTHONWARNINGS=ignore
root=/tmp
[ -d /dev/shm ] && root=/dev/shm
if [ -n "${DRY:-}" ]; then args="--model gpu-bound --rows 20000"; else args="--torch --model gpu-bound --encoder-rows 60000"; fi
for variant in "default" "BENCH_SWITCH_INTERVAL=0.0005" "BENCH_STREAMS=shared" \
               "BENCH_SWITCH_INTERVAL=0.0005 BENCH_STREAMS=shared"; do
  echo "== $variant"
  env $( [ "$variant" = default ] || echo "$variant" ) timeout 90 "$py" bench/bench_gpu_udf.py $args --skip-plain \
    --threads 4 16 --workers --root "$root" --json "$out/diag.jsonl" > "$out/diag-${variant//[ =]/_}.txt" 2>&1
  echo "rc $?"
  grep "model alone\|inline" "$out/diag-${variant//[ =]/_}.txt"
done
