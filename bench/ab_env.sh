#!/usr/bin/env bash
# Side by side, interleaved: collie-perf under several settings (environment
# variables) against Open MPI's mpi-perf, 2 ranks on this machine, the same
# sizes and timing (tools/perf_common.c). For judging one change by switching
# it on and off in one build, in one run, round by round: on this shared
# machine whole runs minutes apart differ by up to 2x.
#   bench/ab_env.sh [options] OP LABEL=VAR=VALUE[,VAR=VALUE...] ...
#     OP           all_reduce|all_gather|broadcast|reduce|reduce_scatter|alltoall
#     LABEL=...    a series: collie with these variables (X=1: none)
#   options (environment):
#     TRANSPORT=tcp|shm  tcp (default): each rank a host of its own
#                  (NCCL_HOSTID) over loopback, Open MPI with --mca btl self,tcp;
#                  shm: shared memory, Open MPI with vader
#     ROUNDS=5 B=8 E=32K F=4 N=40 W=100 M=0  rounds; sizes -b -e -f; calls -n,
#                  warm-up -w, at least M ms timed per size (-M)
#     HOG=0        1: one busy process (a shell loop) runs beside every series
#     BIND=none|default  collie unbound (collie-run --bind-to none, default) or
#                  with collie-run's binding
#     INPLACE=0|1  report the in-place column (compare_mpi.sh does for broadcast)
#     MPI=1|0      add the Open MPI series
#     CHECK=1|0    -c: one checked call before the warm-up (compare_mpi.sh
#                  runs -c 0: its warm-up is the band's -w alone)
#     BUILD=build  the build folder
# Prints per size and series the median time (us) and every round's.
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
op=$1
shift
build=${BUILD:-build}
rounds=${ROUNDS:-5} b=${B:-8} e=${E:-32K} n=${N:-40} w=${W:-100} m=${M:-0}
col=6
[ "${INPLACE:-0}" = 1 ] && col=10
bind=(--bind-to none)
[ "${BIND:-none}" = default ] && bind=()
export NCCL_SOCKET_IFNAME=lo
args=("$op" -b "$b" -e "$e" -f "${F:-4}" -n "$n" -w "$w" -M "$m" -c "${CHECK:-1}" -d float -o sum)
if [ "${TRANSPORT:-tcp}" = tcp ]; then
  wrap=(sh -c 'NCCL_HOSTID=h$COLLIE_RANK exec "$0" "$@"')
  btl=(--mca btl self,tcp --mca btl_tcp_if_include lo)
else
  wrap=()
  btl=(--mca btl self,vader)
fi
if [ "${HOG:-0}" = 1 ]; then
  sh -c 'while :; do :; done' &
  hog_pid=$!
  trap 'kill $hog_pid 2>/dev/null' EXIT INT TERM
fi
rows() { awk -v t="$1" -v c="$col" '/^ +[0-9]+ /{print t, $1, $c}'; }
for r in $(seq "$rounds"); do
  for series in "$@"; do
    label=${series%%=*}
    IFS=, read -r -a vars <<<"${series#*=}"
    env "${vars[@]}" "$build/collie-run" -n "${NP:-2}" "${bind[@]}" "${wrap[@]}" "$build/collie-perf" "${args[@]}" 2>&1 | rows "$label"
  done
  if [ "${MPI:-1}" = 1 ]; then
    mpirun --allow-run-as-root --oversubscribe -np "${NP:-2}" --mca pml ob1 "${btl[@]}" "$build/mpi-perf" "${args[@]}" 2>&1 |
      rows mpi
  fi
done | awk '{k = $2 " " $1; v[k] = v[k] " " $3; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }}
  END {
    for (i = 1; i <= nk; i++) {
      split(keys[i], f, " "); m = split(v[keys[i]], a, " ")
      for (x = 1; x <= m; x++) s[x] = a[x] + 0
      for (x = 2; x <= m; x++) { t = s[x]; y = x - 1; while (y >= 1 && s[y] > t) { s[y + 1] = s[y]; y-- } s[y + 1] = t }
      printf "%10s %-8s med %9.3f |%s\n", f[1], f[2], s[int((m + 1) / 2)], v[keys[i]]
    }
  }' | sort -k1,1n -s
