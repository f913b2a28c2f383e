#!/usr/bin/env bash
# Multi-host test on one machine: three "hosts" are network namespaces joined
# by veth pairs to a bridge in a fourth namespace (10.77.0.1-3/24). Two ranks
# per host (6 in all) run collectives over the socket transport, each host
# with its own NCCL_HOSTID and NCCL_SOCKET_IFNAME naming its veth; the
# bootstrap root is rank 0 on host 1 (NCCL_COMM_ID + COLLIE_BOOTSTRAP_SECRET).
# Then, while every rank loops over allreduces, host 3's link is cut at the
# bridge (ip link set ... down: no packets, no resets) and every rank on
# hosts 1 and 2 must fail with an error, not hang (COLLIE_PEER_TIMEOUT).
# Needs root (ip netns); exits 77 (skipped) where namespaces are not allowed.
# Usage: netns_multihost.sh RANK_PROGRAM [coll|cut]   (default: cut)
set -u
prog=${1:?usage: netns_multihost.sh RANK_PROGRAM [coll|cut]}
mode=${2:-cut}
peer_timeout=${NETNS_PEER_TIMEOUT:-3}
# Generous bound: a late error is still a pass, only a hang is a failure.
bound=$((3 * peer_timeout + 10))
hosts=3
per_host=2
nranks=$((hosts * per_host))

skip() { echo "SKIPPED: $*"; exit 77; }
command -v ip >/dev/null || skip "'ip' (iproute2) is not installed"
[ -x "$prog" ] || { echo "FAIL: no rank program at $prog"; exit 1; }

# Unique names (PID) so parallel runs do not clash; interface names <= 15 chars.
tag=$$
ns_br="collie${tag}br"
ns() { echo "collie${tag}h$1"; }
vh() { echo "v${tag}h$1"; }   # host end, inside host namespace i
vb() { echo "v${tag}b$1"; }   # bridge end
work=$(mktemp -d /tmp/collie-netns.XXXXXX)
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  for i in $(seq 1 $hosts); do ip netns del "$(ns "$i")" 2>/dev/null; done
  ip netns del "$ns_br" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$ns_br" 2>"$work/err" || skip "cannot create a network namespace ($(cat "$work/err")); run as root"
ip -n "$ns_br" link set lo up
ip -n "$ns_br" link add br0 type bridge || { echo "FAIL: cannot create a bridge"; exit 1; }
ip -n "$ns_br" link set br0 up
for i in $(seq 1 $hosts); do
  ip netns add "$(ns "$i")" || { echo "FAIL: ip netns add $(ns "$i")"; exit 1; }
  ip -n "$(ns "$i")" link set lo up
  ip link add "$(vh "$i")" netns "$(ns "$i")" type veth peer name "$(vb "$i")" netns "$ns_br" ||
    { echo "FAIL: cannot create veth pair $i"; exit 1; }
  ip -n "$ns_br" link set "$(vb "$i")" master br0 up
  ip -n "$(ns "$i")" addr add "10.77.0.$i/24" dev "$(vh "$i")"
  ip -n "$(ns "$i")" link set "$(vh "$i")" up
done
# No STP on the bridge: its ports forward at once, and the bootstrap retries
# refused or unreachable connections until COLLIE_BOOTSTRAP_TIMEOUT anyway.
echo "netns: $hosts hosts up (10.77.0.1-$hosts via bridge in $ns_br)"

secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
port=$((20000 + RANDOM % 20000))
start_ranks() {
  local m=$1
  pids=()
  for r in $(seq 0 $((nranks - 1))); do
    local h=$((r / per_host + 1))
    ip netns exec "$(ns "$h")" env COLLIE_RANK=$r COLLIE_SIZE=$nranks \
      NCCL_COMM_ID="10.77.0.1:$port" COLLIE_BOOTSTRAP_SECRET="$secret" \
      NCCL_HOSTID="netns-host-$h" NCCL_SOCKET_IFNAME="=$(vh "$h")" \
      COLLIE_PEER_TIMEOUT="$peer_timeout" COLLIE_BOOTSTRAP_TIMEOUT=60 \
      "$prog" "$m" 120 >"$work/rank$r.out" 2>&1 &
    pids+=($!)
  done
}

# Waits for rank processes until `deadline` (epoch seconds, fractional);
# records each exit status and time in status[r] / exit_at[r].
declare -A status exit_at
wait_ranks() {
  local deadline=$1
  while :; do
    local left=0
    for r in $(seq 0 $((nranks - 1))); do
      [ -n "${status[$r]:-}" ] && continue
      if kill -0 "${pids[$r]}" 2>/dev/null; then left=$((left + 1)); continue; fi
      wait "${pids[$r]}"; status[$r]=$?; exit_at[$r]=$(date +%s.%N)
    done
    [ $left = 0 ] && return 0
    if awk -v d="$deadline" -v n="$(date +%s.%N)" 'BEGIN { exit !(n > d) }'; then return 1; fi
    sleep 0.05
  done
}
show_output() { for r in $(seq 0 $((nranks - 1))); do sed "s/^/  [rank $r] /" "$work/rank$r.out"; done; }
# A hang's evidence, before the ranks are killed: each running rank's state
# and every thread's stack (gdb, where installed; the tests run as root).
dump_stacks() {
  for r in $(seq 0 $((nranks - 1))); do
    local p=${pids[$r]}
    kill -0 "$p" 2>/dev/null || continue
    echo "rank $r (pid $p) still running: $(grep -m1 '^State' /proc/$p/status 2>/dev/null)"
    command -v gdb >/dev/null || { echo "  (no gdb: no stacks)"; continue; }
    timeout 10 gdb -p "$p" -batch -nx -ex 'thread apply all bt' 2>/dev/null |
      grep -E '^(#|Thread)' | sed "s/^/  [rank $r] /"
  done
}

# ---- collectives across the three hosts
start_ranks "$([ "$mode" = cut ] && echo cut || echo coll)"
if [ "$mode" != cut ]; then
  if ! wait_ranks "$(awk -v n="$(date +%s.%N)" 'BEGIN { printf "%.3f", n + 120 }')"; then
    echo "FAIL: ranks still running after 120 s (a hang)"; show_output; dump_stacks; exit 1
  fi
  fail=0
  for r in $(seq 0 $((nranks - 1))); do [ "${status[$r]}" = 0 ] || { echo "FAIL: rank $r exited ${status[$r]}"; fail=1; }; done
  show_output
  [ $fail = 0 ] && echo "PASS: collectives on $nranks ranks over $hosts namespaces"
  exit $fail
fi

# Wait until every rank has checked its collectives and is looping.
deadline=$(( $(date +%s) + 120 ))
while :; do
  n=$(cat "$work"/rank*.out 2>/dev/null | grep -c ': looping$' || true)
  [ "$n" -ge $nranks ] && break
  for r in $(seq 0 $((nranks - 1))); do
    if ! kill -0 "${pids[$r]}" 2>/dev/null; then
      echo "FAIL: rank $r ended before the link cut:"; show_output; exit 1
    fi
  done
  [ "$(date +%s)" -lt $deadline ] || { echo "FAIL: ranks not all looping after 120 s:"; show_output; dump_stacks; exit 1; }
  sleep 0.1
done
echo "PASS: collectives (allreduce, allgather, broadcast, reduce-scatter; 1..1M floats) on $nranks ranks over $hosts namespaces"

# ---- cut host 3 off at the bridge
sleep 0.5
cut_at=$(date +%s.%N)
ip -n "$ns_br" link set "$(vb $hosts)" down
echo "netns: cut host $hosts's link ($(vb $hosts) down); COLLIE_PEER_TIMEOUT=$peer_timeout s, bound $bound s"
if ! wait_ranks "$(awk -v n="$cut_at" -v b="$bound" 'BEGIN { printf "%.3f", n + b }')"; then
  echo "FAIL: after $bound s some ranks still had no error (a hang):"
  for r in $(seq 0 $((nranks - 1))); do [ -z "${status[$r]:-}" ] && echo "  rank $r (host $((r / per_host + 1))) still running"; done
  echo "  (failure detection, COLLIE_PEER_TIMEOUT, is not turning the silent host into an error)"
  show_output
  dump_stacks
  exit 1
fi
fail=0
for r in $(seq 0 $((nranks - 1))); do
  h=$((r / per_host + 1))
  dt=$(awk -v e="${exit_at[$r]}" -v c="$cut_at" 'BEGIN { printf "%.2f", e - c }')
  line=$(grep -m1 'ERROR\|NO ERROR\|FAIL' "$work/rank$r.out" || echo "(no report)")
  ab=$(grep -m1 -o 'abort took [0-9.]* s' "$work/rank$r.out" || true)
  echo "rank $r (host $h): exit ${status[$r]}, $dt s after the cut${ab:+, $ab}: $line"
  if [ $h -ne $hosts ] && [ "${status[$r]}" != 3 ]; then
    echo "FAIL: rank $r on a connected host did not end with the error (exit ${status[$r]})"; fail=1
  fi
done
if [ $fail != 0 ]; then show_output; exit 1; fi
echo "PASS: every rank on hosts 1-$((hosts - 1)) got an error within $bound s of the cut"
exit 0
