#!/usr/bin/env bash
# The main job: set up a fresh Debian 12 machine (as root), build collie,
# bring up 4 local ranks that print what they learned about each other, run
# collie-perf (allreduce, allgather, broadcast; 8 B .. 64 MiB, results
# checked; allreduce again with buffers from ncclMemAlloc) on 4 local ranks,
# then time init at 2..128 ranks.
# bench/compare_mpi.sh is the longer side-by-side comparison with Open MPI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/deps.sh"
"$here/scripts/build.sh" "$here/build"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
echo "== collie-run -n 4 collie-hello"
"$here/build/collie-run" -n 4 "$here/build/collie-hello"
for op in all_reduce all_gather broadcast; do
  echo "== collie-run -n 4 collie-perf $op -b 8 -e 64M -f 4"
  "$here/build/collie-run" -n 4 "$here/build/collie-perf" $op -b 8 -e 64M -f 4 -c 1
done
echo "== collie-run -n 4 collie-perf all_reduce -b 8 -e 64M -f 4 -R 1 (buffers from ncclMemAlloc: the mapped allreduce)"
"$here/build/collie-run" -n 4 "$here/build/collie-perf" all_reduce -b 8 -e 64M -f 4 -c 1 -R 1
echo "== init scaling"
"$here/bench/init_scaling.sh" "$here/build"
