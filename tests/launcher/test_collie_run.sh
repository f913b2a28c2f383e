#!/usr/bin/env bash
# Behaviour tests for the local launcher (tools/collie_run.c): environment,
# failure supervision, --tag-output, --timeout, usage errors.
# Usage: test_collie_run.sh PATH/TO/collie-run   (ranks are sh + coreutils only)
set -u

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
    echo "usage: $0 PATH/TO/collie-run" >&2
    exit 2
fi
CR=$1
pass=0
fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/collie-run-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

ok() {
    if [ "$1" = 0 ]; then
        echo "ok - $2"
        pass=$((pass + 1))
    else
        echo "not ok - $2"
        fail=$((fail + 1))
        # What the launcher said, to debug the failure from the log alone.
        [ -s "$tmp/err" ] && sed 's/^/#   stderr: /' "$tmp/err" | head -20
        [ -s "$tmp/out" ] && sed 's/^/#   stdout: /' "$tmp/out" | head -20
    fi
}

# Every launch is bounded, so a launcher that hangs fails the test instead of
# hanging it. 60 s is far above what any case needs (LIMIT: one case needs
# more). Ranks that must outlive a correct launcher sleep 300 s, so a launcher
# that waited for them would meet this bound (exit 124) instead of passing;
# no assertion depends on how fast a loaded machine runs a case.
run() {
    timeout -k 5 "${LIMIT:-60}" "$CR" "$@" >"$tmp/out" 2>"$tmp/err"
}

# A zombie counts as gone: it has exited, and whether init reaps it is not
# the launcher's business.
alive() {
    local st
    st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# --- environment -----------------------------------------------------------
prev_secret=
for n in 1 3 8; do
    env -u NCCL_COMM_ID "$CR" -n "$n" sh -c \
        'echo "$COLLIE_RANK $COLLIE_SIZE $COLLIE_LOCAL_RANK $COLLIE_LOCAL_SIZE $NCCL_COMM_ID $COLLIE_BOOTSTRAP_SECRET"' \
        >"$tmp/out" 2>"$tmp/err"
    rc=$?
    bad=0
    [ "$rc" = 0 ] || bad=1
    [ "$(wc -l <"$tmp/out")" -eq "$n" ] || bad=1
    [ "$(sort -n "$tmp/out" | cut -d' ' -f1 | tr '\n' ' ')" = "$(seq -s ' ' 0 $((n - 1))) " ] || bad=1
    [ "$(cut -d' ' -f5 "$tmp/out" | sort -u | wc -l)" -eq 1 ] || bad=1
    [ "$(cut -d' ' -f6 "$tmp/out" | sort -u | wc -l)" -eq 1 ] || bad=1
    while read -r rank size lrank lsize commid secret; do
        [ "$size" = "$n" ] && [ "$lrank" = "$rank" ] && [ "$lsize" = "$n" ] || bad=1
        [[ $commid =~ ^127\.0\.0\.1:([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] &&
            [ "${BASH_REMATCH[1]}" -le 65535 ] || bad=1
        [[ $secret =~ ^[0-9a-f]{32}$ ]] || bad=1
    done <"$tmp/out"
    # A per-job secret: two jobs in a row must not share one.
    secret=$(head -1 "$tmp/out" | cut -d' ' -f6)
    [ "$secret" != "$prev_secret" ] || bad=1
    prev_secret=$secret
    ok $bad "N=$n: rank/size/local vars, one 127.0.0.1 NCCL_COMM_ID, one 32-hex secret"
done

NCCL_COMM_ID=192.0.2.7:41234 run -n 3 sh -c 'echo "$NCCL_COMM_ID"'
rc=$?
[ "$rc" = 0 ] && [ "$(sort -u "$tmp/out")" = 192.0.2.7:41234 ] &&
    [ "$(wc -l <"$tmp/out")" -eq 3 ] && [ ! -s "$tmp/err" ]
ok $? "a user-set NCCL_COMM_ID is passed on unchanged, silently"

# The port collie-run names in NCCL_COMM_ID stays bound from before the first
# fork: rank 0 inherits a listener on it (COLLIE_BOOTSTRAP_ROOT_FD, the
# socket /proc/net/tcp lists as listening on that port), no other rank does,
# and nobody else can bind the port while rank 0 has not started its root
# (rank 0 sleeps here; with the port only named, two jobs started at once
# once had one's port taken by the other's listener).
run -n 2 sh -c '
    port=${NCCL_COMM_ID##*:}
    if [ "$COLLIE_RANK" = 0 ]; then
        [ -n "${COLLIE_BOOTSTRAP_ROOT_FD-}" ] || { echo "rank 0: no COLLIE_BOOTSTRAP_ROOT_FD"; exit 3; }
        inode=$(readlink "/proc/$$/fd/$COLLIE_BOOTSTRAP_ROOT_FD" | sed -n "s/^socket:\[\([0-9]*\)\]$/\1/p")
        hex=$(printf "%04X" "$port")
        awk -v p=":$hex" -v i="$inode" "\$2 ~ p\"\$\" && \$4 == \"0A\" && \$10 == i { f = 1 } END { exit !f }" /proc/net/tcp ||
            { echo "rank 0: descriptor $COLLIE_BOOTSTRAP_ROOT_FD (inode ${inode:-none}) does not listen on port $port"; exit 3; }
        sleep 2
        echo "rank 0 ok"
    else
        [ -z "${COLLIE_BOOTSTRAP_ROOT_FD-}" ] || { echo "rank $COLLIE_RANK: COLLIE_BOOTSTRAP_ROOT_FD is set"; exit 3; }
        # python3 binds the port (sh cannot); the suite installs it (scripts/deps.sh).
        [ -x /usr/bin/python3 ] || { echo "rank 1: /usr/bin/python3 is needed to try the port"; exit 3; }
        /usr/bin/python3 -c "
import errno, socket, sys
s = socket.socket()
try:
    s.bind((\"127.0.0.1\", $port))
except OSError as e:
    sys.exit(0 if e.errno == errno.EADDRINUSE else 4)
print(\"rank 1: port $port was free to bind before rank 0 started its root\")
sys.exit(3)" || exit 3
        echo "rank 1 ok"
    fi'
[ $? = 0 ] && [ "$(sort "$tmp/out")" = "$(printf 'rank 0 ok\nrank 1 ok')" ]
ok $? "the NCCL_COMM_ID port is held for rank 0 (inherited listener, nobody else can bind it)"

run -n 2 -x FOO=bar -x EMPTY= sh -c 'echo "$FOO|${EMPTY-unset}"'
[ $? = 0 ] && [ "$(sort -u "$tmp/out")" = "bar|" ]
ok $? "-x VAR=VALUE reaches every rank (also an empty value)"

# --- supervision -----------------------------------------------------------
# Ranks 0 and 2 park a `sleep 300` grandchild and record its pid; rank 1 waits
# for both records (up to 60 s), then fails. The sleeps must be gone when the
# launcher is.
mkdir "$tmp/pids"
start=$SECONDS
PIDS=$tmp/pids LIMIT=120 run -n 3 sh -c '
    if [ "$COLLIE_RANK" = 1 ]; then
        i=0
        while [ ! -s "$PIDS/0" ] || [ ! -s "$PIDS/2" ]; do
            i=$((i + 1)); [ $i -gt 1200 ] && break; sleep 0.05
        done
        exit 3
    fi
    sleep 300 & echo $! >"$PIDS/t$COLLIE_RANK" && mv "$PIDS/t$COLLIE_RANK" "$PIDS/$COLLIE_RANK"
    wait'
rc=$?
elapsed=$((SECONDS - start))
left=0
for f in "$tmp"/pids/[02]; do
    [ -s "$f" ] || { left=1; continue; }
    alive "$(cat "$f")" && left=1
done
[ "$rc" = 1 ] && [ "$left" = 0 ] &&
    grep -q "rank 1 (pid [0-9]*) exited with status 3" "$tmp/err"
ok $? "a rank exiting 3 stops the job: exit 1 in ${elapsed}s, message names rank 1, no sleep left"

run -n 2 sh -c 'if [ "$COLLIE_RANK" = 1 ]; then kill -9 $$; fi; exec sleep 300'
rc=$?
[ "$rc" = 137 ] && grep -q "rank 1 (pid [0-9]*) killed by signal 9" "$tmp/err"
ok $? "a rank killed by SIGKILL: exit 137, message names the signal (got $rc)"

# SIGTERM to the launcher reaches every rank. Each rank records that it is
# ready, then that it got the signal. No timeout(1) here: $! must be the
# launcher itself; the loops below bound the wait instead.
mkdir "$tmp/term"
D=$tmp/term "$CR" -n 2 sh -c '
    trap "echo >\"\$D/got\$COLLIE_RANK\"; exit 0" TERM
    echo >"$D/ready$COLLIE_RANK"
    sleep 300 & wait' >"$tmp/out" 2>"$tmp/err" &
launcher=$!
for _ in $(seq 1200); do
    [ -e "$tmp/term/ready0" ] && [ -e "$tmp/term/ready1" ] && break
    sleep 0.05
done
kill -TERM "$launcher"
for _ in $(seq 1200); do
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.05
done
kill -KILL "$launcher" 2>/dev/null
wait "$launcher"
rc=$?
[ "$rc" = 143 ] && [ -e "$tmp/term/got0" ] && [ -e "$tmp/term/got1" ]
ok $? "SIGTERM to the launcher is forwarded to every rank, exit 143 (got $rc)"

# --- --tag-output ----------------------------------------------------------
# 50000 bytes is more than one pipe read and less than the launcher's line
# buffer, so the long line must come out whole, with one prefix.
run -n 2 --tag-output sh -c '
    r=$COLLIE_RANK
    echo "out$r"; echo "err$r" >&2
    head -c 50000 /dev/zero | tr "\0" "$r"; echo
    printf "last$r"'
rc=$?
bad=0
[ "$rc" = 0 ] || bad=1
for r in 0 1; do
    long=$(printf "%050000d" 0 | tr 0 "$r")
    [ "$(grep -F "[$r] " "$tmp/out" | cut -c1-20 | tr '\n' ' ')" = \
        "[$r] out$r [$r] $(printf "%016d" 0 | tr 0 "$r") [$r] last$r " ] || bad=1
    grep -qxF "[$r] $long" "$tmp/out" || bad=1
    [ "$(grep -cxF "[$r] err$r" "$tmp/err")" = 1 ] || bad=1
done
[ "$(wc -l <"$tmp/out")" = 6 ] && [ "$(wc -l <"$tmp/err")" = 2 ] || bad=1
grep -qv '^\[[01]\] ' "$tmp/out" "$tmp/err" && bad=1
ok $bad "--tag-output prefixes stdout and stderr lines, long and unterminated ones too"

# --- timeout, exec failure, usage ------------------------------------------
start=$SECONDS
run --timeout 1 -n 2 sleep 300
rc=$?
elapsed=$((SECONDS - start))
[ "$rc" != 0 ] && grep -qi "timeout" "$tmp/err"
ok $? "--timeout 1 stops sleeping ranks: exit $rc after ${elapsed}s, says timeout"

run -n 2 "$tmp/no-such-program" arg
rc=$?
[ "$rc" != 0 ] && grep -q "cannot execute '$tmp/no-such-program'" "$tmp/err"
ok $? "a program that cannot be executed: exit $rc with 'cannot execute'"

bad=0
for args in "-n 0 true" "-n -1 true" "-n abc true" "-n 4097 true" "-n" "true" "-n 2" \
    "--np" "--bogus -n 1 true" "-x NOEQUALS -n 1 true"; do
    # shellcheck disable=SC2086  # word splitting is the point
    run $args
    rc=$?
    if [ "$rc" != 2 ] || ! grep -q "^usage: " "$tmp/err"; then
        echo "#   'collie-run $args' gave exit $rc"
        bad=1
    fi
done
: >"$tmp/err" >"$tmp/out"
ok $bad "bad -n values (0, -1, abc, 4097, missing) and other usage errors: exit 2 with usage"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
