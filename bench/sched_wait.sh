#!/usr/bin/env bash
# How long the ranks of a 2-rank collie-perf loop wait for a CPU: their
# processes' time on a CPU and time runnable but waiting over one second of
# a long run (/proc/PID/schedstat), as fractions of that second. What
# coll/adapt.c's look (COLLIE_ADAPT_LOAD) reads, seen from outside.
#   bench/sched_wait.sh [HOG=0|1] [BIND=default|none] OP SIZE
#     HOG=1   one busy shell loop runs beside the ranks
#     BIND    collie-run's default binding, or --bind-to none
#     BUILD=build  the build folder
set -uo pipefail
[ $# -eq 2 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
build=${BUILD:-build}
hog=
cleanup() {
  [ -n "$hog" ] && kill -9 "$hog" 2>/dev/null
  [ -n "${pids:-}" ] && kill $pids 2>/dev/null
}
trap cleanup EXIT INT TERM
if [ "${HOG:-0}" = 1 ]; then
  sh -c 'while :; do :; done' &
  hog=$!
fi
bind=()
[ "${BIND:-default}" = none ] && bind=(--bind-to none)
timeout 30 "$build/collie-run" -n 2 "${bind[@]}" "$build/collie-perf" "$1" -b "$2" -e "$2" -n 1000000 -w 10 -c 0 \
  >/dev/null 2>&1 &
run=$!
sleep 1.5
pids=$(pgrep -x collie-perf | tr '\n' ' ') # the ranks (timeout > collie-run > collie-perf)
snap() { for p in $pids; do [ -r "/proc/$p/schedstat" ] && echo "$p $(cat "/proc/$p/schedstat")"; done; }
a=$(snap)
t0=$(date +%s%N)
sleep 1
b=$(snap)
t1=$(date +%s%N)
join <(echo "$a") <(echo "$b") |
  awk -v dt=$((t1 - t0)) '{printf "pid %s: on a CPU %.2f, waiting for one %.2f (%.0f%% of its runnable time)\n",
    $1, ($5 - $2) / dt, ($6 - $3) / dt, 100 * ($6 - $3) / (($5 - $2) + ($6 - $3) + 1)}'
kill $pids 2>/dev/null
wait "$run" 2>/dev/null
exit 0
