#!/bin/bash
# Device-buffer benchmark for a machine with a GPU (not run yet: the session
# that wrote it had none). One run measures, in this order:
#   1. the device-to-device copy bandwidth floor (cudaMemcpyAsync, 1 MiB..1 GiB);
#   2. collie allreduce with device buffers, 2 and 4 ranks sharing GPU 0, 8 B..1 GiB;
#   3. NVIDIA's NCCL (the toolkit's libnccl) at 1 rank, same sizes, and collie at 1 rank.
# Usage: bench/gpu_perf.sh [BUILD_DIR] [MAXBYTES]   (prints tables; paste into docs/BENCHMARKS.md)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
max=${2:-1073741824}
cuda=${CUDA_HOME:-/usr/local/cuda}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -o "$out/gpu-perf-collie" "$here/gpu_perf.c" -I"$cuda/include" -L"$build" -lcollie \
   -L"$cuda/lib64" -lcudart -Wl,-rpath,"$build" -Wl,-rpath,"$cuda/lib64"
cc -O2 -o "$out/gpu-perf-nccl" "$here/gpu_perf.c" -I"$cuda/include" -L"$cuda/lib64" -lnccl -lcudart \
   -Wl,-rpath,"$cuda/lib64"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "## copy floor"
"$out/gpu-perf-collie" copy "$max"
for n in 2 4; do
  echo "## collie, $n ranks on one GPU"
  "$out/gpu-perf-collie" allreduce "$n" 8 "$max"
done
echo "## NVIDIA NCCL, 1 rank"
"$out/gpu-perf-nccl" allreduce 1 8 "$max"
echo "## collie, 1 rank"
"$out/gpu-perf-collie" allreduce 1 8 "$max"
