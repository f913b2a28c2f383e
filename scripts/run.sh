#!/usr/bin/env bash
# The main job: set up a fresh Debian 12 machine (as root), build collie, and
# bring up 4 local ranks that print what they learned about each other and
# how long init took; then time init at 2..128 ranks (bench/init_scaling.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/deps.sh"
"$here/scripts/build.sh" "$here/build"
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
echo "== collie-run -n 4 collie-hello"
"$here/build/collie-run" -n 4 "$here/build/collie-hello"
echo "== init scaling"
"$here/bench/init_scaling.sh" "$here/build"
