#!/usr/bin/env bash
# The whole test suite: set up a fresh Debian 12 machine (as root), build with
# -Werror, run every test (unit, multi-process, launcher, ABI, valgrind), then
# build again with AddressSanitizer + UBSan and run the suite there too.
# Set COLLIE_TEST_NO_ASAN=1 to skip the sanitizer pass.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/deps.sh"
before=$(ls /dev/shm 2>/dev/null | grep -ci collie || true)
"$here/scripts/build.sh" "$here/build"
status=0
(cd "$here/build" && ctest -j2 --output-on-failure --timeout 900) || status=1
if [ "${COLLIE_TEST_NO_ASAN:-0}" != 1 ]; then
  "$here/scripts/build.sh" "$here/build-asan" -DCOLLIE_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug
  # The collective sweep runs its quick variant here (sanitizers slow it ~3x).
  (cd "$here/build-asan" && COLLIE_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
     ctest -j2 --output-on-failure --timeout 900 -E 'valgrind') || status=1
fi
after=$(ls /dev/shm 2>/dev/null | grep -ci collie || true)
if [ "$after" -gt "$before" ]; then
  echo "FAIL: the tests left collie segments in /dev/shm:"; ls /dev/shm | grep -i collie; status=1
fi
exit $status
