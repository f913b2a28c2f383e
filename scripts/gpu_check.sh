#!/usr/bin/env bash
# The device path on a machine with an NVIDIA GPU, in one go: collie's GPU
# tests (also with NCCL_P2P_DISABLE=1 and COLLIE_DEVICE_KERNELS=0, and once
# under compute-sanitizer), a client's binaries (nccl-tests, when given),
# PyTorch's own nccl backend on collie, then the benchmarks; a table at the end.
#
# Usage: scripts/gpu_check.sh [PREFIX]
#   PREFIX  a folder made by scripts/gpu_bundle.sh (lib/, bin/, nt/); without
#           it collie is built into build-gpu and bundled into build-gpu/bundle
#           (client binaries only if CLIENT_BIN names a folder of them).
# Environment:
#   LOGDIR  where each check's log goes (default /tmp/collie-gpu-logs); packed
#           into $RESULTS_DIR/gpu-logs.tgz every 15 s and at the end
#   PHASES  which phases run (default "env tests extra sanitize clients torch perf mps";
#           also "variants": the kernel settings in VARIANTS timed and checked)
#   QUICK=1 shorter sweeps (each check keeps its own time limit)
#   TORCH_ARGS  extra arguments for tests/gpu/torch_nccl.py (e.g. --quick)
#   NT_MAX  largest size for the client runs (default 1G)
#   DEADLINE  seconds the whole script may take (default 1500); checks are cut
#           short to fit it, and those with no time left are NOTRUN
#   PARALLEL=1  run the test, client and torch phases side by side (correctness
#           only: they share the GPU; without MPS they then wait for each
#           other's time slices); perf always runs alone, last
#   LANE_ORDER  with PARALLEL=0, the order of the lanes (default "1 4 3 2":
#           extra+sanitize, torch, clients, then the sweeps)
# Suggested device call (prepared in the 2026-12-04 session, which was then
# lent no machine): bundle here first (`CLIENT_BIN=<folder with the 7
# nccl-tests *_perf built against include/nccl.h> scripts/gpu_bundle.sh
# build-gpu .gpu/b`, carry .gpu), then one call of `RESULTS_DIR=$OUT
# UNDER_MPS=1 PARALLEL=1 QUICK=1 DEADLINE=400 PERF_RESERVE=170 NT_MAX=64M
# PHASES="env tests clients torch variants" scripts/gpu_check.sh .gpu/b`
# with the call's own timeout some 50 s above DEADLINE. Build build-gpu with
# -DCMAKE_CUDA_ARCHITECTURES=90-real (one architecture: a third of the
# kernels' compile time).
#   UNDER_MPS=1  start an MPS control daemon after the env phase and run
#           everything under it (ranks in separate processes then share the GPU
#           without time slices; the mps phase is skipped)
# Each check has a time limit; a check that passes its limit is reported as
# TIMEOUT and its process group is killed, so the script ends in bounded time.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-}
if [ -z "$prefix" ]; then
  "$here/scripts/build.sh" "$here/build-gpu" -DCOLLIE_CUDA=ON -DCMAKE_BUILD_TYPE=Release || exit 1
  "$here/scripts/gpu_bundle.sh" "$here/build-gpu" "$here/build-gpu/bundle" || exit 1
  prefix=$here/build-gpu/bundle
fi
prefix=$(cd "$prefix" && pwd)
results_dir=${RESULTS_DIR:-${OUT:-$here/gpu-logs}}
LOGDIR=${LOGDIR:-/tmp/collie-gpu-logs}
PHASES=${PHASES:-env tests extra sanitize clients torch perf mps}
DEADLINE=${DEADLINE:-1500}
PARALLEL=${PARALLEL:-0}
QUICK=${QUICK:-0}
NT_MAX=${NT_MAX:-1G}
mkdir -p "$LOGDIR" "$results_dir"
table=$LOGDIR/table.txt
: >"$table"
bin=$prefix/bin
lib=$prefix/lib
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
py=${PYTHON:-python3}
start=$(date +%s)
# The perf phase keeps this many seconds of the deadline for itself.
perf_reserve=0
[[ " $PHASES " == *" perf "* || " $PHASES " == *" mps "* || " $PHASES " == *" variants "* ]] && perf_reserve=${PERF_RESERVE:-180}

pack() {
  tar -C "$LOGDIR" -czf "$results_dir/gpu-logs.tgz" . 2>/dev/null
  cp "$table" "$results_dir/table.txt" 2>/dev/null
}
# The device tool brings back at most 8 files from $OUT: the logs stay in
# LOGDIR and are packed into RESULTS_DIR/gpu-logs.tgz every 15 s (and at the
# end), so a call cut short still brings them back.
(
  exec 2>/dev/null # no "Terminated" when finish_pack stops it
  while sleep 15; do
    tar -C "$LOGDIR" -czf "$results_dir/.gpu-logs.part" . && mv -f "$results_dir/.gpu-logs.part" "$results_dir/gpu-logs.tgz"
  done
) &
packer=$!
# Stops the packer and its sleep or tar, then packs once more.
finish_pack() {
  pkill -P "$packer" 2>/dev/null
  kill "$packer" 2>/dev/null
  wait "$packer" 2>/dev/null
  rm -f "$results_dir/.gpu-logs.part"
  pack
}
trap 'finish_pack; exit 1' INT TERM

# check NAME LIMIT_S CMD...: runs CMD with its output in LOGDIR/NAME.log.
# Every process it starts carries COLLIE_GPU_CHECK=NAME in its environment;
# whatever of them is still alive when the check ends (a rank its parent
# left behind, in its own session) is killed, so that no orphan keeps a GPU
# context or an MPS client open for the checks after it.
check() {
  local name=$1 limit=$2
  shift 2
  local t0 t1 rc status left
  left=$((start + DEADLINE - ${reserve:-0} - $(date +%s)))
  if [ "$left" -lt 5 ]; then
    printf '%-34s %-10s %7.1f s\n' "$name" NOTRUN 0 | tee -a "$table"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$(date +%s.%N)
  COLLIE_GPU_CHECK=$name CHECK_LIMIT=$limit timeout -k 5 "$limit" "$@" >"$LOGDIR/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  reap "$name" >>"$LOGDIR/$name.log"
  case $rc in
    0) status=PASS ;;
    77) status=SKIP ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL($rc)" ;;
  esac
  printf '%-34s %-10s %7.1f s\n' "$name" "$status" "$(awk "BEGIN{print $t1 - $t0}")" | tee -a "$table"
  [ "$status" = PASS ] || tail -n 15 "$LOGDIR/$name.log" | sed "s/^/    [$name] /"
  return 0
}
# reap NAME: kills the processes a check left behind (see check).
reap() {
  local p pid n=0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = $$ ] && continue
    if tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qx "COLLIE_GPU_CHECK=$1"; then
      kill -KILL "$pid" 2>/dev/null && n=$((n + 1))
    fi
  done
  [ "$n" = 0 ] || echo "gpu_check: killed $n process(es) left behind by $1"
}

# NVIDIA's NCCL for the baselines: the one PyTorch ships, else the toolkit's.
nvidia_nccl() {
  local d
  d=$($py -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && { echo "$d/libnccl.so.2"; return; }
  for d in ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libnccl.so.2" ] && { echo "$d/libnccl.so.2"; return; }
  done
}
alias_dir=/tmp/collie-gpu-nccl-alias
mkdir -p "$alias_dir"
real_nccl=$(nvidia_nccl)
[ -n "$real_nccl" ] && ln -sf "$real_nccl" "$alias_dir/libcollie.so.0"

phase() { [[ " $PHASES " == *" $1 "* ]]; }

# MPS: one control daemon per pipe folder. One left running by an earlier
# run on this machine is used as it is; stopping is bounded (quit waits for
# every client, and a client that never ends would hold it forever).
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/collie-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/collie-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] &&
    echo get_server_list | timeout 10 nvidia-cuda-mps-control >"$LOGDIR/mps_start.log" 2>&1; then
    echo "(an MPS control daemon was already running; used as it is)" >>"$LOGDIR/mps_start.log"
    return 0
  fi
  timeout 20 nvidia-cuda-mps-control -d >"$LOGDIR/mps_start.log" 2>&1
}
mps_stop() {
  if ! echo quit | timeout 15 nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "gpu_check: the MPS daemon did not quit within 15 s; killed" | tee -a "$LOGDIR/mps_start.log"
    pkill -KILL -f nvidia-cuda-mps 2>/dev/null
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

if phase env; then
  {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    nvcc --version | tail -n 2
    uname -r
    echo "NVIDIA NCCL for baselines: ${real_nccl:-none}"
    $py -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available())'
    command -v compute-sanitizer
  } >"$LOGDIR/env.log" 2>&1
  cat "$LOGDIR/env.log"
  check abi_device 60 "$bin/gpu_abi_device"
fi
if [ "${UNDER_MPS:-0}" = 1 ]; then
  if command -v nvidia-cuda-mps-control >/dev/null && mps_start; then
    echo "== everything below runs under MPS"
    PHASES=${PHASES// mps/}
  else
    echo "UNDER_MPS=1 but the MPS daemon did not start: $(cat "$LOGDIR/mps_start.log" 2>/dev/null)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi

run_tests() {
  q=""
  [ "$QUICK" = 1 ] && q=quick
  check coll_1 120 "$bin/gpu_test_coll" 1 $q
  check coll_2 240 "$bin/gpu_test_coll" 2 $q
  check coll_4 240 "$bin/gpu_test_coll" 4 quick
  check coll_socket_2 240 env COLLIE_TEST_HOSTID=1 "$bin/gpu_test_coll" 2 quick
  check coll_2_p2p_disable 240 env NCCL_P2P_DISABLE=1 "$bin/gpu_test_coll" 2 quick
  check coll_2_kernels_off 240 env COLLIE_DEVICE_KERNELS=0 "$bin/gpu_test_coll" 2 quick
}
run_extra() {
  if [ -x "$bin/gpu_test_extra" ]; then
    for c in memalloc_1 graph_1 graph_2 graph_cold_1 graph_cold_2 streams_2 register_2 mixed_2 abort_2 killed_2 timeout_2 \
      a2a_uneven_1 a2a_uneven_2; do
      check "extra_$c" 90 "$bin/gpu_test_extra" "$c"
    done
  fi
}
run_sanitize() {
  command -v compute-sanitizer >/dev/null || return 0
  local cs="compute-sanitizer --target-processes all --error-exitcode 9"
  check sanitize_memcheck_coll_1 120 $cs --tool memcheck "$bin/gpu_test_coll" 1 quick
  check sanitize_memcheck_streams_2 90 $cs --tool memcheck "$bin/gpu_test_extra" streams_2
  check sanitize_racecheck_graph_2 90 $cs --tool racecheck "$bin/gpu_test_extra" graph_2
}

# nccl-tests-style clients: every *_perf in PREFIX/nt, checking on. A run
# passes when the binary exits 0 and reports no wrong or out-of-bounds values.
nt_check() {
  local name=$1 limit=$2
  shift 2
  check "$name" "$limit" "$@"
  local log=$LOGDIR/$name.log
  if grep -q 'Out of bounds values : 0 OK' "$log"; then :; elif grep -q 'Out of bounds values' "$log"; then
    sed -i "s/^\($name  *\)PASS /\1WRONG/" "$table"
    echo "    [$name] wrong values: $(grep 'Out of bounds' "$log")"
  fi
}
run_clients() {
  [ -d "$prefix/nt" ] || return 0
  for t in all_reduce all_gather broadcast reduce reduce_scatter alltoall sendrecv; do
    b=$prefix/nt/${t}_perf
    [ -x "$b" ] || continue
    nt_check "nt_${t}_1rank" 120 "$b" -b 8 -e "$NT_MAX" -f 4 -c 1 -n 5 -w 2
    nt_check "nt_${t}_2ranks" 150 env LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=2 "$b" -t 2 -g 1 -b 8 -e "$NT_MAX" -f 4 -c 1 -n 5 -w 2
  done
  b=$prefix/nt/all_reduce_perf
  [ -x "$b" ] && nt_check nt_all_reduce_4ranks 150 env LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=4 "$b" -t 4 -g 1 -b 8 -e 256M -f 4 -c 1 -n 5 -w 2
  [ -x "$b" ] && nt_check nt_all_reduce_graph_1rank 120 "$b" -b 8 -e 64M -f 8 -c 1 -n 5 -w 2 -G 5
  return 0
}

run_torch() {
  if [ -e "$here/tests/gpu/torch_nccl.py" ]; then
    # collie's libnccl.so.2 both first on the library path and preloaded, ahead of PyTorch's own NCCL.
    for n in 1 2; do
      # Every call collie sees, per process, for the next reader of a failure.
      check "torch_nccl_${n}" 240 env LD_PRELOAD="$lib/libnccl.so.2" PYTHONUNBUFFERED=1 \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL,P2P NCCL_DEBUG_FILE="$LOGDIR/torch_nccl_${n}.%h.%p.nccl" \
        $py "$here/tests/gpu/torch_nccl.py" --nprocs "$n" --backend nccl --device cuda --timeout 180 ${TORCH_ARGS:-}
    done
    # Which NCCL functions PyTorch imports, and which of them collie does not export.
    $py - >"$LOGDIR/torch_nccl_symbols.log" 2>&1 <<EOF
import glob, os, subprocess, torch
libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda*.so"))
want = set()
for l in libs:
    out = subprocess.run(["nm", "-D", "--undefined-only", l], capture_output=True, text=True).stdout
    want |= {w.split()[-1].split("@")[0] for w in out.splitlines() if " nccl" in w}
have = subprocess.run(["nm", "-D", "--defined-only", "$lib/libcollie.so.0"], capture_output=True, text=True).stdout
have = {w.split()[-1].split("@")[0] for w in have.splitlines()}
print("PyTorch imports", len(want), "nccl symbols;", "collie lacks:", sorted(want - have) or "none")
EOF
    cat "$LOGDIR/torch_nccl_symbols.log"
  fi
}

lane1() {
  phase extra && run_extra
  phase sanitize && run_sanitize
  return 0
}
lane2() { phase tests && run_tests; return 0; }
lane3() { phase clients && run_clients; return 0; }
lane4() { phase torch && run_torch; return 0; }
reserve=$perf_reserve
if [ "$PARALLEL" = 1 ]; then
  lane1 & lane2 & lane3 & lane4 &
  wait
else
  # One after the other: the long multi-process sweeps (lane 2) last, so that
  # a deadline cuts them rather than the short checks.
  for l in ${LANE_ORDER:-1 4 3 2}; do "lane$l"; done
fi
reserve=0

if phase perf; then
  max=${PERF_MAX:-1073741824}
  check perf_copy_floor 60 "$bin/gpu-perf" copy "$max"
  check perf_collie_1rank 120 "$bin/gpu-perf" allreduce 1 8 "$max"
  if [ -n "$real_nccl" ]; then
    check perf_nccl_1rank 120 env LD_LIBRARY_PATH="$alias_dir:$LD_LIBRARY_PATH" "$bin/gpu-perf" allreduce 1 8 "$max"
  fi
  # Ranks in separate processes share the GPU by time slices (no MPS): each
  # hand-off between their kernels waits for a slice, so this stays short.
  check perf_collie_2proc 60 "$bin/gpu-perf" allreduce 2 1024 67108864
  b=$prefix/nt/all_reduce_perf
  if [ -x "$b" ]; then
    for n in 2 4; do
      check "perf_nt_all_reduce_${n}threads" 120 env LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=$n "$b" -t $n -g 1 -b 8 -e "$NT_MAX" -f 4 -c 0 -n 20 -w 5
    done
    # The element loop with four groups in flight per thread (COLLIE_DEV_UNROLL), against the line above; then
    # checked once with it.
    check perf_nt_all_reduce_2threads_unroll4 120 env COLLIE_DEV_UNROLL=4 LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=2 "$b" -t 2 -g 1 -b 8 -e "$NT_MAX" -f 4 -c 0 -n 20 -w 5
    nt_check nt_all_reduce_2threads_unroll4 120 env COLLIE_DEV_UNROLL=4 LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=2 "$b" -t 2 -g 1 -b 8 -e 64M -f 4 -c 1 -n 5 -w 2
    check perf_nt_all_reduce_1rank 90 "$b" -b 8 -e "$NT_MAX" -f 4 -c 0 -n 20 -w 5
    [ -n "$real_nccl" ] && check perf_nt_all_reduce_1rank_nvidia 90 env LD_LIBRARY_PATH="$alias_dir:$LD_LIBRARY_PATH" "$b" -b 8 -e "$NT_MAX" -f 4 -c 0 -n 20 -w 5
  fi
fi

# The kernel's settings side by side (phase "variants"): nccl-tests' all_reduce
# at 2 threads for each setting in VARIANTS (each a list of VAR=VALUE, "-" for
# the defaults), then 2 processes (MPS where it runs), then every collective
# checked once with the setting CHECK_VARIANT. (Nsight Compute serializes kernels, so
# a kernel that waits for a peer's kernel cannot be profiled with it.)
VARIANTS=${VARIANTS:-"- COLLIE_DEV_UNROLL=4 NCCL_MAX_CTAS=1 NCCL_MAX_CTAS=2"}
CHECK_VARIANT=${CHECK_VARIANT:-COLLIE_DEV_UNROLL=4}
variant_env() { [ "$1" = - ] && return 0; echo "${1//,/ }"; }
variant_name() { local v=${1//COLLIE_DEV_/}; v=${v//=/}; v=${v//,/_}; [ "$v" = - ] && v=default; echo "${v,,}"; }
if phase variants; then
  b=$prefix/nt/all_reduce_perf
  for v in $VARIANTS; do
    n=$(variant_name "$v")
    if [ -x "$b" ]; then
      check "var_nt_all_reduce_2threads_$n" 60 env $(variant_env "$v") LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=2 \
        "$b" -t 2 -g 1 -b 64K -e 256M -f 4 -c 0 -n 10 -w 3
    fi
    check "var_gpuperf_2proc_$n" 60 env $(variant_env "$v") "$bin/gpu-perf" allreduce 2 65536 268435456
  done
  if [ -n "$CHECK_VARIANT" ] && [ -d "$prefix/nt" ]; then
    n=$(variant_name "$CHECK_VARIANT")
    for t in all_reduce all_gather reduce_scatter broadcast reduce; do
      [ -x "$prefix/nt/${t}_perf" ] || continue
      nt_check "var_check_${t}_2threads_$n" 60 env $(variant_env "$CHECK_VARIANT") LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=2 \
        "$prefix/nt/${t}_perf" -t 2 -g 1 -b 8 -e 64M -f 4 -c 1 -n 3 -w 1
    done
    [ -x "$prefix/nt/all_reduce_perf" ] && nt_check "var_check_all_reduce_4threads_$n" 60 env $(variant_env "$CHECK_VARIANT") \
      LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=4 "$prefix/nt/all_reduce_perf" -t 4 -g 1 -b 8 -e 64M -f 4 -c 1 -n 3 -w 1
    # Every datatype and reduction nccl-tests knows, on the same setting.
    for t in all_reduce reduce_scatter; do
      [ -x "$prefix/nt/${t}_perf" ] && nt_check "var_check_${t}_types_ops_$n" 60 env $(variant_env "$CHECK_VARIANT") \
        LD_PRELOAD="$lib/libvdev.so" COLLIE_VDEV=2 "$prefix/nt/${t}_perf" -t 2 -g 1 -b 8 -e 2M -f 16 -d all -o all -c 1 -n 1 -w 1
    done
  fi
fi

# The same processes under MPS, where their kernels run side by side. The
# control daemon is started here (a user-space service, no GPU setting
# changes) and stopped at the end.
if phase mps && command -v nvidia-cuda-mps-control >/dev/null; then
  if mps_start; then
    check mps_perf_collie_2proc 60 "$bin/gpu-perf" allreduce 2 8 "${PERF_MAX:-1073741824}"
    check mps_perf_collie_4proc 60 "$bin/gpu-perf" allreduce 4 8 268435456
    check mps_coll_2 120 "$bin/gpu_test_coll" 2
    check mps_coll_4 120 "$bin/gpu_test_coll" 4 quick
    mps_stop
  else
    echo "MPS daemon did not start: $(cat "$LOGDIR/mps_start.log")"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
fi
if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then mps_stop; fi

echo
echo "== gpu_check: $(($(date +%s) - start)) s on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
cat "$table"
finish_pack
! grep -qv ' PASS \| SKIP ' "$table"
