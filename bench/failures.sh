#!/usr/bin/env bash
# Failure-handling figures (docs/BENCHMARKS.md, "Failures"): 4 ranks run a
# 64 MiB float allreduce loop; one rank is killed with SIGKILL (or frozen with
# SIGSTOP: no FIN, no RST) at a random moment; every survivor must get an
# error naming it, shrink with NCCL_SHRINK_ABORT, check one allreduce on the
# new communicator and abort the old one. Reported per trial: the latest
# survivor's kill-to-error time, ncclCommShrink, shrink + first allreduce of
# 64 MiB, ncclCommAbort of the broken parent; then medians and maxima.
# Also ncclCommAbort from another thread in the middle of a collective.
# Usage: bench/failures.sh [BUILD_DIR] [TRIALS]
set -euo pipefail
build=${1:-build}; trials=${2:-20}
bin="$build/tests/failures/test_failures"
[ -x "$bin" ] || { echo "no $bin: build the tests first" >&2; exit 1; }
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_DEBUG=${NCCL_DEBUG:-NONE}
bytes=$((64 << 20))
echo "## kill -9, shared memory (one host), COLLIE_PEER_TIMEOUT=${COLLIE_PEER_TIMEOUT:-10}"
"$bin" kill "$trials" "$bytes" 2>/dev/null | grep -E '^(trial|fault|ncclComm|shrink|[0-9]+ trials)'
echo
echo "## kill -9, sockets (every rank its own host via NCCL_HOSTID)"
COLLIE_TEST_HOSTID=1 "$bin" kill "$trials" "$bytes" 2>/dev/null | grep -E '^(trial|fault|ncclComm|shrink|[0-9]+ trials)'
echo
echo "## SIGSTOP (silent peer), shared memory, COLLIE_PEER_TIMEOUT=${COLLIE_PEER_TIMEOUT:-10}"
"$bin" stop 3 "$bytes" 2>/dev/null | grep -E '^(trial|fault|ncclComm|shrink|[0-9]+ trials)'
echo
echo "## ncclCommAbort from another thread during an 8 MiB allreduce loop (4 ranks, shm), 10 runs"
for i in $(seq 1 10); do "$bin" abort 4 2>/dev/null | awk '/ncclCommAbort in another thread/ {print $(NF-1)}'; done |
  sort -g | awk '{a[NR]=$1} END {printf "ncclCommAbort mid-collective   median %8.1f ms  max %8.1f ms  (%d runs)\n", a[int((NR+1)/2)], a[NR], NR}'
