# Sourced by the GPU machine's scripts (gpu_device_run.sh, gpu_threads_diag.sh): where figures
# go ($out: $OUT there, ./gpu-out here), pylance from the carried .device-bundle (not with DRY=1,
# which runs the same steps here with the CPU stand-ins), the Python to run ($py).
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
if [ -f .device-bundle/site.tar.xz ] && [ -z "${DRY:-}" ]; then
  site=$(mktemp -d) && tar xJf .device-bundle/site.tar.xz -C "$site" && export PYTHONPATH="$site:$PWD"
fi
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 LANCE_LOG=error
