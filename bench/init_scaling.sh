#!/usr/bin/env bash
# Init time (bootstrap + peer-info allgather) at 2, 8, 32 and 128 local ranks.
# For each size: REPS runs; per run, the slowest rank's ncclCommInitRank time
# (it includes waiting for the last process to start) and the whole job's wall
# time (fork/exec of every rank to the last exit). Prints medians as a
# markdown table. Usage: bench/init_scaling.sh [BUILD_DIR] [REPS] [sizes...]
set -euo pipefail
build=${1:-build}; reps=${2:-5}; shift $(( $# > 2 ? 2 : $# )) || true
sizes=("$@"); [ ${#sizes[@]} -gt 0 ] || sizes=(2 8 32 128)
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
ulimit -n 65536 2>/dev/null || true
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "| ranks | max init per rank, ms (median of $reps) | job wall, ms (median) | init ms per rank |"
echo "|---:|---:|---:|---:|"
for n in "${sizes[@]}"; do
  inits=(); walls=()
  for ((i = 0; i < reps; i++)); do
    t0=$(date +%s%N)
    out=$("$build/collie-run" -n "$n" "$build/collie-init-bench")
    t1=$(date +%s%N)
    inits+=("$(echo "$out" | awk '$1=="init_ms" {if ($3>m) m=$3} END {print m}')")
    walls+=("$(( (t1 - t0) / 1000000 ))")
  done
  mi=$(printf '%s\n' "${inits[@]}" | median)
  mw=$(printf '%s\n' "${walls[@]}" | median)
  awk -v n="$n" -v mi="$mi" -v mw="$mw" 'BEGIN { printf "| %d | %.1f | %s | %.2f |\n", n, mi, mw, mi / n }'
done
