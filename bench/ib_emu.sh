#!/usr/bin/env bash
# Network-transport benchmark on one machine (not a test): collie-perf
# all_reduce / all_gather / broadcast at 2 ranks, every rank its own "host"
# (NCCL_HOSTID per rank), over NCCL_NET=Socket, NCCL_NET=IB through the verbs
# emulator (tests/ibemu/libibemu.so) and NCCL_NET=CollieTest (the test net
# plugin, tests/netplugin). No real RDMA device runs here: the IB column shows
# the transport's overhead through an emulator whose "wire" is
# process_vm_readv plus a progress thread, useful only to catch regressions.
# Prints a markdown table (out-of-place time in us, median of ROUNDS runs).
# Usage: bench/ib_emu.sh BUILD_DIR [ROUNDS] [MINBYTES] [MAXBYTES] [ITERS]
#   e.g. bench/ib_emu.sh build 3 8K 8M 20
set -u
build=${1:?usage: $0 BUILD_DIR [ROUNDS] [MINBYTES] [MAXBYTES] [ITERS]}
rounds=${2:-3}
minb=${3:-8K}
maxb=${4:-8M}
iters=${5:-20}
CR=$build/collie-run
PERF=$build/collie-perf
EMU=$build/tests/ibemu/libibemu.so
PLUGIN=$build/tests/netplugin/libnccl-net-collietest.so
for f in "$CR" "$PERF" "$EMU" "$PLUGIN"; do [ -e "$f" ] || { echo "missing $f (build first)" >&2; exit 1; }; done
out=$(mktemp -d "${TMPDIR:-/tmp}/collie-ibemu-bench.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
nets="Socket IB CollieTest"
ops="all_reduce all_gather broadcast"
for r in $(seq 1 "$rounds"); do
  for op in $ops; do
    for net in $nets; do
      timeout 600 "$CR" -n 2 -x NCCL_SOCKET_IFNAME=lo -x NCCL_NET=$net -x COLLIE_IBVERBS_LIBRARY="$EMU" \
        -x COLLIE_IBEMU_DEVICES=mlx5_0:1 -x NCCL_NET_PLUGIN="$PLUGIN" -- \
        sh -c 'NCCL_HOSTID=benchhost$COLLIE_RANK exec "$0" "$@"' "$PERF" "$op" -b "$minb" -e "$maxb" -f 8 \
        -n "$iters" -w 3 >"$out/$op.$net.$r" 2>&1 || echo "run failed: $op $net round $r" >&2
    done
  done
done
# One row per (op, size): the median over rounds of the out-of-place time.
echo "| operation | bytes | Socket (us) | IB, emulated (us) | CollieTest plugin (us) |"
echo "|---|---:|---:|---:|---:|"
for op in $ops; do
  sizes=$(awk '$1 ~ /^[0-9]+$/ {print $1}' "$out/$op.Socket.1" 2>/dev/null)
  for s in $sizes; do
    row="| $op | $s"
    for net in $nets; do
      med=$(for r in $(seq 1 "$rounds"); do awk -v s="$s" '$1 == s {print $6}' "$out/$op.$net.$r"; done |
            sort -n | awk '{v[NR] = $1} END {if (NR) print v[int((NR + 1) / 2)]; else print "-"}')
      row="$row | $med"
    done
    echo "$row |"
  done
done
