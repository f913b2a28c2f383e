#!/usr/bin/env bash
# collie-perf's command line (tools/perf_common.c): help, usage errors and
# their exit status, size suffixes, the operation taken from a link's name.
# Nothing here needs a working collective: every case stops before init.
# Usage: test_perf_args.sh PATH/TO/collie-perf
set -u

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: $0 PATH/TO/collie-perf" >&2
    exit 2
fi
PERF=$(readlink -f "$1")
pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/perf-args-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# run EXPECTED_STATUS DESCRIPTION -- command...: checks the exit status; the
# output is kept in $tmp/out and $tmp/err for further checks.
run() {
    local want=$1 what=$2
    shift 3
    timeout -k 5 60 "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [ "$got" = "$want" ]; then
        echo "ok - $what"
        pass=$((pass + 1))
        return 0
    fi
    echo "not ok - $what (exit $got, expected $want)"
    sed 's/^/#   stderr: /' "$tmp/err" | head -10
    sed 's/^/#   stdout: /' "$tmp/out" | head -10
    fail=$((fail + 1))
    return 1
}

# check DESCRIPTION -- command...: a further condition on the last run.
check() {
    local what=$1
    shift 2
    if "$@"; then
        echo "ok - $what"
        pass=$((pass + 1))
    else
        echo "not ok - $what"
        fail=$((fail + 1))
    fi
}

run 0 "-h exits 0" -- "$PERF" -h
check "-h prints the usage on stdout" -- grep -q '^usage: collie-perf OPERATION' "$tmp/out"
check "-h lists every operation" -- grep -q 'all_reduce all_gather broadcast reduce reduce_scatter alltoall' "$tmp/out"
run 0 "--help exits 0" -- "$PERF" --help
run 0 "-h after an operation exits 0" -- "$PERF" all_reduce -b 8 -h

run 2 "no operation exits 2" -- "$PERF"
check "no operation: message and usage on stderr" -- grep -q 'no operation' "$tmp/err"
run 2 "bad operation name exits 2" -- "$PERF" all_reduse -b 8
check "bad operation: named in the message" -- grep -q "unknown operation 'all_reduse'" "$tmp/err"
check "bad operation: usage on stderr" -- grep -q '^usage: collie-perf' "$tmp/err"
check "bad operation: nothing on stdout" -- test ! -s "$tmp/out"
run 2 "two operations exit 2" -- "$PERF" all_reduce broadcast

run 2 "bad size suffix exits 2" -- "$PERF" all_reduce -b 8X
check "bad size suffix: named in the message" -- grep -q "invalid size for -b/--minbytes: '8X'" "$tmp/err"
check "bad size suffix: usage on stderr" -- grep -q '^usage: collie-perf' "$tmp/err"
run 2 "trailing garbage after a suffix exits 2" -- "$PERF" all_reduce -e 8MBX
run 0 "sizes with K/M/G, a fraction and B parse (then -h)" -- "$PERF" all_reduce -b 1.5K -e 8MB -i 1g -h
run 2 "negative size exits 2" -- "$PERF" all_reduce -b -8
run 2 "empty size exits 2" -- "$PERF" all_reduce -b ''
run 2 "bad -i exits 2" -- "$PERF" all_reduce -i 1Q
run 2 "-b larger than -e exits 2" -- "$PERF" all_reduce -b 2M -e 1M
run 2 "unknown datatype exits 2" -- "$PERF" all_reduce -d float128
run 2 "unknown op exits 2" -- "$PERF" all_reduce -o mulsum
run 2 "-n 0 exits 2" -- "$PERF" all_reduce -n 0
run 2 "-a 4 exits 2" -- "$PERF" all_reduce -a 4
run 2 "-t 2 exits 2 (one rank per process)" -- "$PERF" all_reduce -t 2
run 2 "unknown option exits 2" -- "$PERF" all_reduce --frobnicate
run 2 "missing option value exits 2" -- "$PERF" all_reduce -b
run 2 "a zero step exits 2" -- "$PERF" all_reduce -b 8 -e 64 -i 0
# With -b equal to -e a zero step is allowed: that size once (it looped forever).
run 0 "a zero step with -b equal to -e: runs" -- "$PERF" all_reduce -b 8 -e 8 -i 0 -n 1 -w 1 -c 0
check "... one line for that size" -- test "$(grep -c '^ *8 ' "$tmp/out")" -eq 1

run 2 "-M -1 exits 2" -- "$PERF" all_reduce -M -1
check "-M -1: named in the message" -- grep -q "invalid -M/--min_time_ms: '-1'" "$tmp/err"
run 2 "-M without a number exits 2" -- "$PERF" all_reduce -M 5ms

# -M makes more calls than -n where one call is short; each call is logged
# (NCCL_DEBUG_SUBSYS=COLL), so the calls can be counted (2 floats: the
# benchmark's own; its time and error counts use other types). A call would
# have to take over 2.5 ms for the 200 ms run to make fewer than 80.
calls() { grep -c ' INFO AllReduce: opCount .* count 2 datatype 7 ' "$tmp/err"; }
run 0 "one rank, -n 1 -w 4: runs" -- env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL "$PERF" all_reduce -b 8 -e 8 -n 1 -w 4 -c 0
check "... exactly 5 calls a placement (10)" -- test "$(calls)" -eq 10
run 0 "one rank, -n 1 -w 4 -M 200: runs" -- env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL "$PERF" all_reduce -b 8 -e 8 -n 1 -w 4 -c 0 -M 200
check "... the header names the minimum time" -- grep -q '^# min time per size: 200 ms' "$tmp/out"
check "... far more calls than -n asks for" -- test "$(calls)" -gt 80

# -R: 0 or 1; 1 allocates with ncclMemAlloc (host memory without a GPU).
run 2 "-R 2 is refused" -- "$PERF" all_reduce -R 2
check "... and says why" -- grep -q "invalid -R/--local_register" "$tmp/err"
run 0 "one rank, -R 1: ncclMemAlloc'd buffers, checked" -- env COLLIE_MEMALLOC=host "$PERF" all_reduce -b 8 -e 1M -f 8 -n 2 -w 1 -c 1 -R 1
check "... no wrong results" -- grep -q "Out of bounds values : 0 OK" "$tmp/out"
check "... the rank line names the allocator" -- grep -q "ncclMemAlloc" "$tmp/out"

# -P: which placements are timed; the other's columns say N/A, and only the
# chosen placement's calls are made (5 a placement, as above).
run 2 "-P sideways is refused" -- "$PERF" all_reduce -P sideways
check "... and says why" -- grep -q "invalid -P/--placement: 'sideways'" "$tmp/err"
run 0 "one rank, -P in: runs" -- env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL "$PERF" all_reduce -b 8 -e 8 -n 1 -w 4 -c 0 -P in
check "... 5 calls, not 10" -- test "$(calls)" -eq 5
check "... the out-of-place columns say N/A, the in-place ones a time" -- \
    grep -Eq '^ +8 +2 +float +sum +-1 +N/A +N/A +N/A +N/A +[0-9.]+ ' "$tmp/out"
run 0 "one rank, -P out: runs" -- env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL "$PERF" all_reduce -b 8 -e 8 -n 1 -w 4 -c 0 -P out
check "... 5 calls, not 10" -- test "$(calls)" -eq 5
check "... the in-place columns say N/A" -- grep -Eq '^ +8 +2 +float +sum +-1 +[0-9.]+ .*N/A +N/A +N/A +N/A *$' "$tmp/out"
run 0 "one rank, -P out -c 1: the checked placement is right" -- "$PERF" all_reduce -b 8 -e 8 -n 1 -w 1 -c 1 -P out
check "... no wrong results" -- grep -q "Out of bounds values : 0 OK" "$tmp/out"

# The operation from the program's name, as with nccl-tests' binaries.
ln -s "$PERF" "$tmp/all_gather_perf"
run 0 "all_gather_perf -h exits 0" -- "$tmp/all_gather_perf" -h
run 2 "all_gather_perf with an operation argument exits 2" -- "$tmp/all_gather_perf" broadcast
check "... and says the argument is unexpected" -- grep -q "unexpected argument 'broadcast'" "$tmp/err"
ln -s "$PERF" "$tmp/nonsense_perf"
run 2 "an unknown *_perf name still needs an operation" -- "$tmp/nonsense_perf"

echo "# $pass passed, $fail failed"
[ "$fail" -eq 0 ]
