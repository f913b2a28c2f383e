#!/usr/bin/env bash
# Allreduce at 2 ranks on this machine, 32-256 MiB, side by side, interleaved:
# collie with buffers from ncclMemAlloc (collie-perf -R 1: the mapped
# allreduce), collie with malloc'd buffers (the ring), Open MPI (mpi-perf
# under mpirun, vader, its default binding) and bench/cma_probe.c (malloc'd
# buffers reduced by cross-memory attach: what a single-copy allreduce of
# such buffers could reach; out of place only). Prints per size and series
# the median busbw (GB/s, out of place / in place) over the rounds and every
# round's. The 8 GB/s target of issue 10 is about this table.
#   bench/mapped.sh [BUILD_DIR]     (default: build)
# Environment: ROUNDS=3, HOG=0 (1: a busy shell loop beside every run),
#   B=32M E=256M F=2 N=10 W=2 (sizes, factor, calls, warm-up), MPI=1 (0: no Open MPI series),
#   CMA=1 (0: no cma_probe series), CMA_BLOCK=1024 (KiB pulled per call).
set -uo pipefail
build=$(cd "${1:-build}" 2>/dev/null && pwd) || { echo "mapped.sh: no build folder '${1:-build}'" >&2; exit 2; }
rounds=${ROUNDS:-3}
args=(all_reduce -b "${B:-32M}" -e "${E:-256M}" -f "${F:-2}" -n "${N:-10}" -w "${W:-2}" -c 0 -d float -o sum)
out=$(mktemp -d)
trap 'rm -rf "$out"; [ -n "${hogpid:-}" ] && kill "$hogpid" 2>/dev/null' EXIT
hogpid=
if [ "${HOG:-0}" = 1 ]; then
  sh -c 'while :; do :; done' &
  hogpid=$!
fi
series=(mapped malloc)
[ "${MPI:-1}" = 1 ] && command -v mpirun >/dev/null && [ -x "$build/mpi-perf" ] && series+=(openmpi)
here=$(cd "$(dirname "$0")" && pwd)
if [ "${CMA:-1}" = 1 ] && cc -O3 -march=native -o "$out/cma_probe" "$here/cma_probe.c"; then series+=(cma); fi
for r in $(seq 1 "$rounds"); do
  for s in "${series[@]}"; do
    case $s in
      mapped) "$build/collie-run" -n 2 "$build/collie-perf" "${args[@]}" -R 1 ;;
      malloc) "$build/collie-run" -n 2 "$build/collie-perf" "${args[@]}" ;;
      openmpi) mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,vader \
                 "$build/mpi-perf" "${args[@]}" ;;
      cma) "$out/cma_probe" -b "${B:-32M}" -e "${E:-256M}" -f "${F:-2}" -n "${N:-10}" -w "${W:-2}" -k "${CMA_BLOCK:-1024}" ;;
    esac 2>&1 | awk -v s="$s" -v r="$r" '/^ +[0-9]/ { print s, r, $1, $8, $12 }' >>"$out/rows"
  done
done
echo "# allreduce, 2 ranks, busbw GB/s (out of place / in place): median over $rounds rounds [each round]$([ "${HOG:-0}" = 1 ] && echo ', beside a CPU hog')"
printf '%-10s %12s  %s\n' series bytes "median  [rounds]"
for s in "${series[@]}"; do
  for size in $(awk -v s="$s" '$1 == s { print $3 }' "$out/rows" | sort -n -u); do
    awk -v s="$s" -v z="$size" '
      $1 == s && $3 == z { o[++n] = $4; i[n] = $5; all = all sprintf(" %s/%s", $4, $5) }
      function med(a, n,   t, j, k) {
        for (j = 1; j <= n; j++) t[j] = a[j]
        for (j = 1; j <= n; j++) for (k = j + 1; k <= n; k++) if (t[k] + 0 < t[j] + 0) { x = t[j]; t[j] = t[k]; t[k] = x }
        return n % 2 ? t[(n + 1) / 2] : (t[n / 2] + t[n / 2 + 1]) / 2
      }
      END {
        ip = i[1] == "-" ? "-" : sprintf("%.2f", med(i, n))
        printf "%-10s %12s  %.2f / %s  [%s ]\n", s, z, med(o, n), ip, all
      }' "$out/rows"
  done
done
