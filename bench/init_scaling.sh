#!/usr/bin/env bash
# Init scaling: init + destroy of one communicator with N forked local ranks
# (collie-run), N = 2 .. 2048 by default, with where the time goes. For each
# size: REPS runs (1 above 512 ranks: those are long); per run, the job's wall
# time (collie-run start to last exit: includes fork/exec and loading the
# library), spawn = the spread of the ranks' start times (launch, not init),
# "init after last start" = from the last rank's start to the last init's end
# (init's own cost once every rank exists), the slowest rank's
# ncclCommInitRank and ncclCommDestroy, and for
# each init phase the slowest rank's time (from the library's INIT log line
# "init phases ms"): checkin = listener start-up + check-in at the root until
# it answers (includes waiting for the last process to start); table = the
# root's address table and cards spread down a tree; peerinfo = unpacking the
# peer info that came with it (cards);
# setup = locality, rings, tuning; keepalive = keep-alive ring connect and
# watchdog thread start. Medians over the runs. Then, at SPECIAL ranks (1024),
# one run each of ncclCommInitRankScalable (4 and 32 roots), ncclCommSplit
# (two colours) and ncclCommShrink (without the last rank).
# Usage: bench/init_scaling.sh [BUILD_DIR] [REPS] [sizes...]
#   env SPECIAL=1024 (0: skip those runs), BIG_REPS=1 (reps above 512 ranks)
# Limits: raises the open-files soft limit to the hard limit (collie-run holds
# 3 pipes per rank; each rank 2 log2 N + ~10 sockets) and, at 4096 ranks,
# needs a pids limit above ~4 N (each rank runs 2-3 threads).
set -euo pipefail
build=${1:-build}; reps=${2:-3}; shift $(( $# > 2 ? 2 : $# )) || true
sizes=("$@"); [ ${#sizes[@]} -gt 0 ] || sizes=(2 8 32 128 256 512 1024 2048)
special=${SPECIAL:-1024}; big_reps=${BIG_REPS:-1}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ -x "$build/collie-run" ] && [ -x "$build/collie-init-bench" ] || { echo "build $build first" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {if (!NR) print "nan"; else print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
# Spread of the ranks' start times, and the last init's end after the last start.
spawn() { awk '$1=="start_wall" {if (!n++ || $3<lo) lo=$3; if ($3>hi) hi=$3} END {printf "%.1f", hi-lo}' "$1"; }
after_last() { awk '$1=="start_wall" {if ($3>s) s=$3} $1=="ready_wall" {if ($3>e) e=$3} END {printf "%.1f", e-s}' "$1"; }
# Max over ranks of field $2 in lines starting with $1.
maxof() { awk -v k="$1" '$1==k {if ($3>m) m=$3} END {printf "%.1f", m}' "$2"; }
# Max over ranks of each phase in the "init phases ms:" lines (first init of each rank only).
phases() {
  grep -h 'init phases ms:' "$1" | sed 's/.*init phases ms: //' |
    awk '{for (i=1;i<=NF;i+=2) if ($(i+1)>m[$i]) m[$i]=$(i+1)} END {printf "%.1f %.1f %.1f %.1f %.1f", m["checkin"], m["table"], m["peerinfo"], m["setup"], m["keepalive"]}'
}
run() { # n out args... ; prints wall ms
  local n=$1 out=$2; shift 2
  local t0 t1
  t0=$(date +%s%N)
  if ! NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "$build/collie-run" -n "$n" "$build/collie-init-bench" "$@" >"$out" 2>&1; then
    echo "collie-run -n $n collie-init-bench $* failed; last lines:" >&2; tail -5 "$out" >&2; return 1
  fi
  t1=$(date +%s%N)
  echo $(( (t1 - t0) / 1000000 ))
}
echo "Init + destroy of one communicator, forked local ranks ($(nproc) cores); times in ms, slowest rank, median of runs"
echo
echo "| ranks | runs | job wall | spawn | init after last start | init | destroy | checkin | table | peerinfo | setup | keepalive |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in "${sizes[@]}"; do
  r=$reps; [ "$n" -gt 512 ] && r=$big_reps
  : >"$tmp/rows"
  for ((i = 0; i < r; i++)); do
    w=$(run "$n" "$tmp/out") || continue
    echo "$w $(spawn "$tmp/out") $(after_last "$tmp/out") $(maxof init_ms "$tmp/out") $(maxof destroy_ms "$tmp/out") $(phases "$tmp/out")" >>"$tmp/rows"
  done
  [ -s "$tmp/rows" ] || { echo "| $n | 0 | failed | | | | | | | | | |"; continue; }
  row="| $n | $(wc -l <"$tmp/rows")"
  for c in 1 2 3 4 5 6 7 8 9 10; do row+=" | $(awk -v c=$c '{print $c}' "$tmp/rows" | median)"; done
  echo "$row |"
done
if [ "$special" -gt 0 ]; then
  echo
  echo "At $special ranks (one run each): slowest rank, ms"
  echo
  echo "| operation | job wall | op | destroy |"
  echo "|---|---:|---:|---:|"
  for k in 4 32; do
    rm -rf "$tmp/ids"; mkdir "$tmp/ids"
    if w=$(INIT_BENCH_DIR=$tmp/ids run "$special" "$tmp/out" scalable $k); then
      echo "| ncclCommInitRankScalable, $k roots | $w | $(maxof scalable_ms "$tmp/out") | $(maxof destroy_ms "$tmp/out") |"
    fi
  done
  if w=$(run "$special" "$tmp/out" split); then
    echo "| ncclCommSplit (2 colours) after init | $w | $(maxof split_ms "$tmp/out") | $(maxof destroy_ms "$tmp/out") |"
  fi
  if w=$(run "$special" "$tmp/out" shrink); then
    echo "| ncclCommShrink (1 rank out) after init | $w | $(maxof shrink_ms "$tmp/out") | $(maxof destroy_ms "$tmp/out") |"
  fi
fi
