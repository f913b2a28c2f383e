#!/usr/bin/env bash
# Configures and builds collie into a build folder.
# Usage: scripts/build.sh BUILD_DIR [extra cmake args...]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=$1; shift
args=(-DCOLLIE_WERROR=ON)
# The CUDA toolkit is optional; help CMake find a /usr/local install.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
fi
cmake -S "$here" -B "$dir" "${args[@]}" "$@" >"$dir.cmake.log" 2>&1 || { cat "$dir.cmake.log"; exit 1; }
grep 'collie:' "$dir.cmake.log" || true
cmake --build "$dir" -j"$(nproc)"
