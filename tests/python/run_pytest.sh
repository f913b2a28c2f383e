#!/bin/sh
# Runs one pytest file of tests/python as N ranks: alone, under collie-run or
# under mpirun (mpi4py). Exits 77 (ctest SKIP_RETURN_CODE) with a message when
# numpy/pytest/mpi4py/mpirun are missing; a library without the engine fails.
# Usage: run_pytest.sh single|collie-run|mpirun N TESTFILE [COLLIE_RUN]
# COLLIE_LIBRARY and PYTHONPATH come from the environment (tests/python/CMakeLists.txt).
set -u
mode=$1 n=$2 file=$3 collie_run=${4:-}
py=${COLLIE_PYTHON:-/usr/bin/python3}
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the source tree

skip() { echo "SKIPPED: $*"; exit 77; }

"$py" -c 'import numpy, pytest' 2>/dev/null ||
  skip "$py lacks numpy or pytest (apt-get install python3-numpy python3-pytest)"
if [ "$mode" = mpirun ]; then
  "$py" -c 'import mpi4py' 2>/dev/null || skip "$py lacks mpi4py (apt-get install python3-mpi4py)"
  command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (apt-get install openmpi-bin)"
fi
case $file in
  *engine*)
    "$py" -c 'import sys, collie; sys.exit(0 if collie.engine_available() else 3)'
    rc=$?
    [ $rc -eq 3 ] && { echo "FAILED: $COLLIE_LIBRARY has no engine symbols (collie_allreduce_async ...)"; exit 1; }
    [ $rc -ne 0 ] && { echo "FAILED: import collie"; exit 1; }
    ;;
esac

# -x: a rank stops at its first failure, and the launcher then stops the others
# (they would otherwise wait in the next collective for the rank that left).
# faulthandler: a test that hangs prints every thread's stack after 120 s.
args="-q -x -p no:cacheprovider --color=no -o faulthandler_timeout=120 $file"
case $mode in
  single) exec "$py" -m pytest $args ;;
  collie-run) exec "$collie_run" -n "$n" --tag-output --timeout 400 "$py" -m pytest $args ;;
  mpirun) exec mpirun --allow-run-as-root --oversubscribe --tag-output -np "$n" "$py" -m pytest $args ;;
  *) echo "run_pytest.sh: unknown mode $mode"; exit 2 ;;
esac
