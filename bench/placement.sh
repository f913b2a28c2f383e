#!/usr/bin/env bash
# Placement benchmark (not a test): the same 2-rank collie-perf sweep with the
# ranks unbound (COLLIE_BIND=none, as plain fork or torchrun start them),
# unbound but placed by the library at init (COLLIE_BIND=auto) and placed by
# collie-run (its default --bind-to), in interleaved rounds, optionally with a
# busy process beside them; prints the median time (us) per size and config.
# Feeds docs/ARCHITECTURE.md "Placement".
# Usage: bench/placement.sh BUILD_DIR [ROUNDS] [HOG 0|1] [OPS] [RANKS]
#   e.g. bench/placement.sh build 3 1 "all_reduce broadcast" 2
set -u
build=${1:?usage: $0 BUILD_DIR [ROUNDS] [HOG] [OPS] [RANKS]}
rounds=${2:-3}
hog=${3:-0}
ops=${4:-all_reduce broadcast}
ranks=${5:-2}
CR=$build/collie-run
PERF=$build/collie-perf
export NCCL_SOCKET_IFNAME=lo
out=$(mktemp -d "${TMPDIR:-/tmp}/collie-placement.XXXXXX") || exit 1
hog_pid=
cleanup() {
    [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null
    rm -rf "$out"
}
trap cleanup EXIT

if [ "$hog" = 1 ]; then
    # One process that never sleeps, unbound: what a second job or a data
    # loader does to the ranks.
    sh -c 'while :; do :; done' &
    hog_pid=$!
fi

configs="none auto launcher"
for r in $(seq 1 "$rounds"); do
    for op in $ops; do
        for c in $configs; do
            case $c in
                none) args=(--bind-to none -x COLLIE_BIND=none) ;;
                auto) args=(--bind-to none -x COLLIE_BIND=auto) ;;
                launcher) args=() ;;
            esac
            timeout -k 5 600 "$CR" -n "$ranks" "${args[@]}" "$PERF" "$op" -b 8 -e 32M -f 8 -n 20 -w 5 -c 0 \
                >"$out/$op.$c.$r" 2>&1 || echo "# $op $c round $r failed" >&2
        done
    done
done

python3 - "$out" "$rounds" "$ops" "$configs" "$ranks" "$hog" <<'EOF'
import os, statistics, sys
d, rounds, ops, configs, ranks, hog = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5], sys.argv[6]
print(f"# {ranks} ranks, {rounds} rounds, hog={hog}: median out-of-place time in us (collie-perf, float sum)")
for op in ops:
    t = {}
    for c in configs:
        for r in range(1, rounds + 1):
            p = os.path.join(d, f"{op}.{c}.{r}")
            if not os.path.exists(p): continue
            for line in open(p):
                f = line.split()
                if len(f) > 6 and f[0].isdigit():
                    try: t.setdefault((int(f[0]), c), []).append(float(f[5]))
                    except ValueError: pass
    sizes = sorted({s for s, _ in t})
    print(f"\n{op}\n{'bytes':>10} " + " ".join(f"{c:>12}" for c in configs) + "   none/auto none/launcher  (>1: bound faster)")
    for s in sizes:
        med = {c: statistics.median(t[(s, c)]) if (s, c) in t else float('nan') for c in configs}
        print(f"{s:>10} " + " ".join(f"{med[c]:>12.2f}" for c in configs) +
              f"   {med['none'] / med['auto']:>9.2f} {med['none'] / med['launcher']:>13.2f}")
EOF
