#!/usr/bin/env bash
# Where one cell's time goes, collie beside Open MPI: the benchmark call of
# one (collective, size) under `perf stat`, every rank, twice: N and 3N
# timed iterations. The difference between the two runs is the 2N extra
# iterations alone (start-up, set-up and warm-up cancel out); per call and
# rank it gives the CPU time (user and kernel), the context switches and the
# CPU migrations, beside the wall time per call the benchmark reports. A rank
# whose CPU time per call is well below the wall time waited off the CPU
# (slept, or was not scheduled); kernel time is the system calls (single-copy
# copies, sockets, futex waits and yields). Then `perf record` of the long
# run (no call graphs) gives each rank's top symbols. For the cells
# bench/compare_mpi.sh reports below 1.0 (docs/BENCHMARKS.md).
#   bench/explain_miss.sh OP SIZE
#     OP     all_reduce|all_gather|broadcast|reduce|reduce_scatter|alltoall
#     SIZE   bytes as compare_mpi.sh counts them (e.g. 8M)
#   options (environment):
#     NP=2 TRANSPORT=shm|tcp (tcp: each rank a host of its own, Open MPI
#     --mca btl self,tcp)  BIND=none|default (collie unbound or with
#     collie-run's binding; Open MPI always its default)  HOG=0|1 (one busy
#     process beside the ranks)  N=calls of the short run (default: about
#     0.3 s of calls at 5 GB/s, at least 200)  TOP=5 symbols a rank
#     BUILD=build  PERF_RECORD=1 (0: perf stat only)
# Both libraries run the same benchmark source (tools/perf_common.c), in the
# placement compare_mpi.sh reports (-P: in place for broadcast, out of place
# for the rest), so every call counted is one of the cell's.
set -uo pipefail
[ $# -eq 2 ] || { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
op=$1 size=$2
build=$(cd "${BUILD:-build}" 2>/dev/null && pwd) || { echo "explain_miss: no build folder '${BUILD:-build}'" >&2; exit 2; }
np=${NP:-2} top=${TOP:-5}
command -v perf >/dev/null || { echo "explain_miss: perf not found (apt-get install linux-perf)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "explain_miss: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
bytes=$(awk -v s="$size" 'BEGIN { u = toupper(substr(s, length(s))); m = 1
  if (u == "K") m = 1024; else if (u == "M") m = 1048576; else if (u == "G") m = 1073741824
  if (m > 1) s = substr(s, 1, length(s) - 1); printf "%d", s * m }')
if [ -z "${N:-}" ]; then
  # About 0.3 s of calls where a call moves its bytes at 5 GB/s (the
  # small ones take longer than that: a few microseconds each).
  n=$(awk -v b="$bytes" 'BEGIN { t = b / 5000 + 3; n = int(300000 / t); if (n < 200) n = 200; print n }')
else
  n=$N
fi
out=$(mktemp -d /tmp/explain_miss.XXXXXX)
trap 'rm -rf "$out"; [ -n "${hog:-}" ] && kill "$hog" 2>/dev/null' EXIT
hog=""
if [ "${HOG:-0}" = 1 ]; then
  sh -c 'while :; do :; done' &
  hog=$!
fi
export NCCL_SOCKET_IFNAME=lo
placement=out col=6
[ "$op" = broadcast ] && placement=in col=10
events=task-clock,user_time,system_time,context-switches,cpu-migrations

# run LIB ITERS TAG: the benchmark under perf stat (TAG short, long) or perf
# record (TAG rec), one file per rank: $out/LIB.TAG.RANK; prints the
# reported time.
run() {
  local lib=$1 iters=$2 tag=$3
  local wrap="exec perf stat -x, -e $events -o $out/$lib.$tag.\$R"
  [ "$tag" = rec ] && wrap="exec perf record -q -o $out/$lib.$tag.\$R"
  local args=("$op" -b "$bytes" -e "$bytes" -f 2 -n "$iters" -w 5 -M 0 -c 0 -d float -o sum -P "$placement")
  if [ "$lib" = mpi ]; then
    local btl="self,vader"
    [ "${TRANSPORT:-shm}" = tcp ] && btl="self,tcp --mca btl_tcp_if_include lo"
    # shellcheck disable=SC2086
    mpirun --allow-run-as-root --oversubscribe -np "$np" --mca pml ob1 --mca btl $btl \
      sh -c "R=\$OMPI_COMM_WORLD_RANK; $wrap \"\$0\" \"\$@\"" "$build/mpi-perf" "${args[@]}" 2>&1
  else
    local bind=(--bind-to none) host=""
    [ "${BIND:-none}" = default ] && bind=()
    [ "${TRANSPORT:-shm}" = tcp ] && host="NCCL_HOSTID=h\$COLLIE_RANK "
    "$build/collie-run" -n "$np" "${bind[@]}" sh -c "R=\$COLLIE_RANK; ${host}$wrap \"\$0\" \"\$@\"" \
      "$build/collie-perf" "${args[@]}" 2>&1
  fi >"$out/$lib.$tag.log"
  local t
  t=$(awk -v b="$bytes" -v c="$col" '$1 == b { print $c }' "$out/$lib.$tag.log")
  if [ -z "$t" ]; then
    echo "explain_miss: the $lib run ($tag) reported no time for $bytes B; its output:" >&2
    tail -20 "$out/$lib.$tag.log" >&2
    exit 1
  fi
  echo "$t"
}

# stat_of FILE EVENT: the event's value (task-clock in ms, the times in ns).
stat_of() { awk -F, -v e="$2" '$3 == e { print ($1 ~ /^[0-9.]+$/) ? $1 : 0 }' "$1"; }

printf 'explain_miss: %s %s B (%d iterations, then %d), %d ranks, %s, collie %s%s\n' "$op" "$bytes" "$n" $((3 * n)) \
  "$np" "${TRANSPORT:-shm}" "$([ "${BIND:-none}" = default ] && echo bound || echo unbound)" \
  "$([ "${HOG:-0}" = 1 ] && echo ', one CPU hog beside' || true)"
printf '%-7s %4s %10s %10s %6s %6s %8s %8s\n' lib rank "wall us" "cpu us" "user%" "sys%" "cs/call" "migr/call"
for lib in collie mpi; do
  t1=$(run "$lib" "$n" short) || exit 1
  wall=$(run "$lib" $((3 * n)) long) || exit 1
  # Calls between the two runs: the 2n more timed ones.
  calls=$((2 * n))
  for ((r = 0; r < np; r++)); do
    a=$out/$lib.short.$r b=$out/$lib.long.$r
    [ -s "$a" ] && [ -s "$b" ] || { echo "explain_miss: $lib rank $r left no perf stat output" >&2; continue; }
    awk -v lib="$lib" -v r="$r" -v calls="$calls" -v wall="$wall" \
      -v c1="$(stat_of "$a" task-clock)" -v c3="$(stat_of "$b" task-clock)" \
      -v u1="$(stat_of "$a" user_time)" -v u3="$(stat_of "$b" user_time)" \
      -v s1="$(stat_of "$a" system_time)" -v s3="$(stat_of "$b" system_time)" \
      -v x1="$(stat_of "$a" context-switches)" -v x3="$(stat_of "$b" context-switches)" \
      -v m1="$(stat_of "$a" cpu-migrations)" -v m3="$(stat_of "$b" cpu-migrations)" 'BEGIN {
        cpu = (c3 - c1) * 1000 / calls; us = u3 - u1; sy = s3 - s1; tot = us + sy
        pu = tot > 0 ? 100 * us / tot : 0; ps = tot > 0 ? 100 * sy / tot : 0
        printf "%-7s %4d %10s %10.3f %6.0f %6.0f %8.3f %8.4f\n", lib, r, wall, cpu, pu, ps,
          (x3 - x1) / calls, (m3 - m1) / calls }'
  done
  echo "        ($lib: wall, the time the long run reports ($([ "$placement" = in ] && echo in || echo out of) place); the short run's: ${t1:-?} us)"
  if [ "${PERF_RECORD:-1}" = 1 ]; then run "$lib" $((3 * n)) rec >/dev/null || exit 1; fi
done
if [ "${PERF_RECORD:-1}" = 1 ]; then
  for lib in collie mpi; do
    for ((r = 0; r < np && r < 2; r++)); do
      f=$out/$lib.rec.$r
      [ -s "$f" ] || continue
      echo "$lib rank $r, top symbols (a third run of the long length, whole process):"
      perf report -i "$f" --no-children --sort dso,sym 2>/dev/null | grep -v '^#' | grep '%' | head -"$top" |
        sed 's/^/  /'
    done
  done
fi
