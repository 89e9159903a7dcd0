#!/usr/bin/env bash
# The model-column figures of bench/bench_gpu_udf.py on a GPU machine (one GPU, 16 cores) that
# has torch but no Java (so no Spark) and no pylance: ../shared/tools/device-bundle packs pylance
# into .device-bundle/, carried with the working tree. One run: a smoke test at small sizes (stops
# here on failure), then 1M rows (io-bound MLP) and the encoder (GPU-bound) in every configuration,
# then 10M rows of the io-bound model if the time allows. Figures go to $OUT (or ./gpu-out).
# "--bound-threads" rows run those thread counts again with @udf(max_concurrency=4).
# "1 workers, cold" is one task in a fresh process: the cold figure to hold the cold pools to
# ("inline, cold" runs in the bench's process, where the model alone already imported torch
# and made the CUDA context).
#   DRY=1 bench/gpu_device_run.sh   # the same steps at toy sizes with the CPU stand-ins (no torch)
source "$(dirname "$0")/gpu_env.sh"
started=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
nproc; free -g | head -2
# datasets in memory when there is room (no disk in the figures), else on disk
root=/tmp
if [ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -1)" -gt 60 ] 2>/dev/null; then root=/dev/shm; fi
df -h "$root" | tail -1
if [ -n "${DRY:-}" ]; then
  torch=""; small="--rows 20000"; mid="--rows 60000"; big="--rows 100000"
else
  torch="--torch"; small="--rows 20000 --encoder-rows 2000"; mid="--rows 1000000 --encoder-rows 60000"
  big="--rows 10000000"
fi
"$py" -c "import lance, mv_assets; print('lance', lance.__version__)" || exit 1
echo "== smoke"
timeout 150 "$py" bench/bench_gpu_udf.py $torch $small --threads 4 --bound-threads 4 --workers 2 --root "$root" \
  > "$out/smoke.txt" 2>&1; rc=$?
tail -30 "$out/smoke.txt"
[ $rc -eq 0 ] || { echo "smoke failed: $rc"; exit 1; }
echo "== 1M rows and the encoder: every configuration ($(( $(date +%s) - started )) s so far)"
timeout 330 "$py" bench/bench_gpu_udf.py $torch $mid --threads 2 4 8 16 --bound-threads 8 16 --workers 1 4 8 16 \
  --root "$root" \
  --json "$out/mid.jsonl" > "$out/mid.txt" 2>&1
echo "rc $?"
grep -v "^ *written\|^ *view " "$out/mid.txt" | tail -40
left=$(( 480 - ($(date +%s) - started) ))
echo "== 10M rows, io-bound ($left s left)"
if [ $left -gt 160 ]; then
  timeout $(( left - 15 )) "$py" bench/bench_gpu_udf.py $torch $big --model io-bound --threads 16 --bound-threads 16 \
    --workers \
    --root "$root" --json "$out/big.jsonl" > "$out/big.txt" 2>&1
  echo "rc $?"
  grep -v "^ *written\|^ *view " "$out/big.txt" | tail -14
fi
echo "total $(( $(date +%s) - started )) s"
