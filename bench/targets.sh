#!/usr/bin/env bash
# The performance targets of the host-collectives milestone, measured side by
# side with Open MPI: each case runs collie-perf and mpi-perf alternately REPS
# times (same sizes, iterations and timing method: tools/perf_common.c) and
# reports the median time and busbw of each, and their ratio. Out-of-place,
# float sum. Writes a markdown table to stdout.
# Usage: bench/targets.sh [BUILD_DIR] [REPS]
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
reps=${2:-5}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# case: name transport ranks op size iters warmup
cases=(
  "allreduce-8B shm 2 all_reduce 8 2000 100"
  "allreduce-64M shm 2 all_reduce 64M 5 1"
  "allreduce-256M shm 2 all_reduce 256M 3 1"
  "allreduce-64M shm 4 all_reduce 64M 5 1"
  "allreduce-256M shm 4 all_reduce 256M 3 1"
  "allgather-64M shm 2 all_gather 64M 5 1"
  "allgather-64M shm 4 all_gather 64M 5 1"
  "broadcast-64M shm 2 broadcast 64M 5 1"
  "broadcast-64M shm 4 broadcast 64M 5 1"
  "allreduce-8B tcp 2 all_reduce 8 2000 100"
  "allreduce-64M tcp 2 all_reduce 64M 5 1"
  "allgather-64M tcp 2 all_gather 64M 5 1"
  "broadcast-64M tcp 2 broadcast 64M 5 1"
)
echo "| case | transport | ranks | collie time (us) | collie busbw (GB/s) | MPI time (us) | MPI busbw (GB/s) | collie/MPI |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for c in "${cases[@]}"; do
  read -r name tr n op size iters warm <<<"$c"
  args=("$op" -b "$size" -e "$size" -n "$iters" -w "$warm" -c 0 -d float -o sum)
  ct=(); cb=(); mt=(); mb=()
  for ((i = 0; i < reps; i++)); do
    if [ "$tr" = shm ]; then
      out=$("$build/collie-run" -n "$n" "$build/collie-perf" "${args[@]}" 2>/dev/null)
      mout=$("${mpi[@]}" -np "$n" --mca btl self,vader "$build/mpi-perf" "${args[@]}" 2>/dev/null)
    else
      out=$("$build/collie-run" -n "$n" sh -c 'NCCL_HOSTID=h$COLLIE_RANK exec "$0" "$@"' "$build/collie-perf" "${args[@]}" 2>/dev/null)
      mout=$("${mpi[@]}" -np "$n" --mca btl self,tcp --mca btl_tcp_if_include lo "$build/mpi-perf" "${args[@]}" 2>/dev/null)
    fi
    ct+=("$(echo "$out" | awk '$1 ~ /^[0-9]+$/ {print $6}')"); cb+=("$(echo "$out" | awk '$1 ~ /^[0-9]+$/ {print $8}')")
    mt+=("$(echo "$mout" | awk '$1 ~ /^[0-9]+$/ {print $6}')"); mb+=("$(echo "$mout" | awk '$1 ~ /^[0-9]+$/ {print $8}')")
  done
  a=$(printf '%s\n' "${ct[@]}" | median); b=$(printf '%s\n' "${cb[@]}" | median)
  x=$(printf '%s\n' "${mt[@]}" | median); y=$(printf '%s\n' "${mb[@]}" | median)
  awk -v nm="$name" -v tr="$tr" -v n="$n" -v a="$a" -v b="$b" -v x="$x" -v y="$y" \
    'BEGIN { printf "| %s | %s | %d | %s | %s | %s | %s | %.2f |\n", nm, tr, n, a, b, x, y, (a > 0 ? x / a : 0) }'
done
