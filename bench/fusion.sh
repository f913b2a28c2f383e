#!/usr/bin/env bash
# Tensor-fusion benchmark of the engine (not a test): ResNet-50's gradients
# (161 float32 tensors, 25.6 M parameters) allreduced once per step at 2 and 4
# ranks under collie-run, (a) through the engine with fusion (default
# threshold), (b) through the engine with fusion off, (c) as one ncclAllReduce
# of the same total bytes. Modes alternate within each round so load changes
# hit them alike; each cell is the median step time of its best round.
# Usage: bench/fusion.sh [BUILD_DIR] [STEPS] [ROUNDS]   (prints a markdown table)
set -euo pipefail
build=${1:-build}
steps=${2:-10}
rounds=${3:-2}
run="$build/collie-run"
bench="$build/collie-fusion-bench"
[ -x "$run" ] && [ -x "$bench" ] || { echo "build $build first (collie-run, collie-fusion-bench)" >&2; exit 1; }
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}

best() { sort -g | head -1; }

echo "| ranks | (a) engine + fusion, ms/step | (b) engine, no fusion, ms/step | (c) one ncclAllReduce, ms/step | a/c | b/a | negotiation per cached tensor (a), us | per cycle (a), us | per cached tensor (b), us |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in 2 4; do
  a=(); b=(); c=(); na=(); ca=(); nb=()
  for ((r = 0; r < rounds; r++)); do
    read -r _ _ _ _ med _ neg cyc < <("$run" -n "$n" "$bench" engine "$steps")
    a+=("$med"); na+=("$neg"); ca+=("$cyc")
    read -r _ _ _ _ med _ neg _ < <(COLLIE_FUSION_THRESHOLD=0 "$run" -n "$n" "$bench" engine "$steps")
    b+=("$med"); nb+=("$neg")
    read -r _ _ _ _ med _ _ _ < <("$run" -n "$n" "$bench" nccl "$steps")
    c+=("$med")
  done
  A=$(printf '%s\n' "${a[@]}" | best); B=$(printf '%s\n' "${b[@]}" | best); C=$(printf '%s\n' "${c[@]}" | best)
  NA=$(printf '%s\n' "${na[@]}" | best); CA=$(printf '%s\n' "${ca[@]}" | best); NB=$(printf '%s\n' "${nb[@]}" | best)
  awk -v n="$n" -v a="$A" -v b="$B" -v c="$C" -v na="$NA" -v ca="$CA" -v nb="$NB" \
    'BEGIN { printf "| %d | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.0f | %.2f |\n", n, a, b, c, a / c, b / a, na, ca, nb }'
done
