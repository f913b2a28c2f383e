#!/usr/bin/env bash
# Runs a test command with NCCL_DEBUG=INFO lines written to per-process files
# (NCCL_DEBUG_FILE; the mp harness drops rank stderr on success), then
# requires every extended regex given after "--" to match those logs and the
# test plugin to have reported no leaked comm or registration.
# Usage: check_log.sh COMMAND... -- REGEX... (used by tests/netplugin/CMakeLists.txt)
set -u
cmd=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmd+=("$1"); shift; done
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/collie-netplug.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
COLLIE_TESTNET_LEAKFILE="$dir/leaks" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$dir/log.%p" "${cmd[@]}"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: the command exited with $rc"; tail -n 20 "$dir"/log.* 2>/dev/null; exit 1; }
if [ -s "$dir/leaks" ]; then cat "$dir/leaks"; exit 1; fi
for re in "$@"; do
  if ! cat "$dir"/log.* 2>/dev/null | grep -Eq -- "$re"; then
    echo "FAIL: no log line matches: $re"
    tail -n 20 "$dir"/log.* 2>/dev/null
    exit 1
  fi
done
echo "PASS: $# log patterns found"
