#!/usr/bin/env bash
# collie against Open MPI, side by side, in one run: collie-perf (under
# collie-run) and mpi-perf (under mpirun) time the same operations at the same
# sizes with the same method (tools/perf_common.c), over shared memory and
# over TCP loopback, at 2 and 4 ranks. Writes a markdown table per
# (transport, ranks, operation) and a busbw-vs-size plot per (transport,
# ranks) into docs/, between the compare_mpi markers of docs/BENCHMARKS.md.
#
# Usage: bench/compare_mpi.sh [BUILD_DIR]      (default: build)
# Environment: RANKS="2 4"  OPS="all_reduce all_gather broadcast"
#   TRANSPORTS="shm tcp"  CHECK=0 (collie-perf/mpi-perf -c; the test suite
#   checks results, so timing runs skip it by default)
#
# Transports: "shm" is collie's shared memory vs Open MPI's vader BTL; "tcp"
# is collie's socket transport (NCCL_HOSTID set per rank, so every rank looks
# like a host of its own) vs Open MPI's tcp BTL, both on loopback. Open MPI is
# pinned to the ob1 PML, or it could pick UCX and ignore the BTL list.
#
# Sizes 8 B .. 256 MiB, factor 2, in three bands so the whole script stays
# within a few minutes on 2 cores: up to 64 KiB 50 timed calls after 5
# warm-up calls, 128 KiB .. 4 MiB 10 after 2, 8 MiB .. 256 MiB 3 after 1.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" 2>/dev/null && pwd) || { echo "compare_mpi: no build folder '${1:-build}'" >&2; exit 2; }
read -r -a ranks <<<"${RANKS:-2 4}"
read -r -a ops <<<"${OPS:-all_reduce all_gather broadcast}"
read -r -a transports <<<"${TRANSPORTS:-shm tcp}"
check=${CHECK:-0}
bands=("8 64K 50 5" "128K 4M 10 2" "8M 256M 3 1") # -b -e -n -w
per_run_timeout=600

for t in collie-run collie-perf mpi-perf; do
  [ -x "$build/$t" ] || { echo "compare_mpi: $build/$t is missing (mpi-perf needs MPI at configure time)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "compare_mpi: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }

plot=1
if ! command -v gnuplot >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "compare_mpi: installing gnuplot-nox for the plots"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null 2>&1 ||
      { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null 2>&1; }
  fi
  command -v gnuplot >/dev/null || { echo "compare_mpi: gnuplot not available; no plots" >&2; plot=0; }
fi

export NCCL_SOCKET_IFNAME=lo
out=$build/compare_mpi
rm -rf "$out"
mkdir -p "$out" "$here/docs/plots"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t_start=$(date +%s)

perf_args() { # OP BAND -> the common benchmark arguments
  local b e n w
  read -r b e n w <<<"$2"
  echo "$1 -b $b -e $e -f 2 -n $n -w $w -c $check -d float -o sum"
}

# Prints the command line for LIB TRANSPORT N, the benchmark arguments to follow.
launcher() {
  local lib=$1 tr=$2 n=$3
  if [ "$lib" = collie ]; then
    if [ "$tr" = shm ]; then
      echo "$build/collie-run -n $n $build/collie-perf"
    else
      echo "$build/collie-run -n $n sh -c 'NCCL_HOSTID=h\$COLLIE_RANK exec \"\$0\" \"\$@\"' $build/collie-perf"
    fi
  else
    local btl="self,vader"
    [ "$tr" = tcp ] && btl="self,tcp --mca btl_tcp_if_include lo"
    echo "mpirun --allow-run-as-root --oversubscribe -np $n --bind-to none --mca pml ob1 --mca btl $btl $build/mpi-perf"
  fi
}

# Runs one series (LIB TRANSPORT N OP) over all bands; leaves "size time busbw"
# rows (out-of-place columns) in $out/LIB_TR_N_OP.dat and the status in .rc.
run_series() {
  local lib=$1 tr=$2 n=$3 op=$4 key="$1_$2_$3_$4" rc=0 band
  : >"$out/$key.dat"
  : >"$out/$key.log"
  for band in "${bands[@]}"; do
    local cmd
    cmd="$(launcher "$lib" "$tr" "$n") $(perf_args "$op" "$band")"
    echo "\$ $cmd" >>"$out/$key.log"
    timeout -k 10 "$per_run_timeout" bash -c "$cmd" >"$out/$key.band" 2>&1
    local r=$?
    cat "$out/$key.band" >>"$out/$key.log"
    [ $r -ne 0 ] && [ $rc -eq 0 ] && rc=$r
    # Rows whose out-of-place columns are complete (a failing run may cut the
    # last row short).
    awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $1, $6, $8 }' "$out/$key.band" >>"$out/$key.dat"
  done
  rm -f "$out/$key.band"
  echo "$rc" >"$out/$key.rc"
  printf 'compare_mpi: %-6s %-3s n=%d %-10s exit %d, %d sizes\n' "$lib" "$tr" "$n" "$op" "$rc" \
    "$(wc -l <"$out/$key.dat")"
}

for tr in "${transports[@]}"; do
  for n in "${ranks[@]}"; do
    for op in "${ops[@]}"; do
      run_series collie "$tr" "$n" "$op"
      run_series mpi "$tr" "$n" "$op"
    done
  done
done
elapsed=$(($(date +%s) - t_start))

# ---- plots ----------------------------------------------------------------
if [ $plot = 1 ]; then
  for tr in "${transports[@]}"; do
    for n in "${ranks[@]}"; do
      png="$here/docs/plots/compare_mpi_${tr}_n${n}.png"
      {
        echo "set terminal pngcairo size 960,600 font ',10' noenhanced"
        echo "set output '$png'"
        echo "set title 'busbw vs size, $n ranks, ${tr} (collie: solid, Open MPI: dashed) - $started'"
        echo "set logscale x 2; set format x '%.0b%B'; set xlabel 'size (bytes)'"
        echo "set ylabel 'busbw (GB/s, out-of-place)'; set grid; set key top left"
        printf 'plot '
        local_sep=""
        color=1
        for op in "${ops[@]}"; do
          for lib in collie mpi; do
            f="$out/${lib}_${tr}_${n}_${op}.dat"
            [ -s "$f" ] || continue
            dt=1; [ $lib = mpi ] && dt=2
            name="$op collie"; [ $lib = mpi ] && name="$op Open MPI"
            printf "%s'%s' using 1:3 with linespoints lw 2 dt %d lc %d pt 7 ps 0.6 title '%s'" \
              "$local_sep" "$f" $dt $color "$name"
            local_sep=", "
          done
          color=$((color + 1))
        done
        echo
      } >"$out/plot_${tr}_${n}.gp"
      gnuplot "$out/plot_${tr}_${n}.gp" 2>>"$out/gnuplot.log" || echo "compare_mpi: gnuplot failed ($out/gnuplot.log)" >&2
    done
  done
fi

# ---- markdown ---------------------------------------------------------------
section=$out/section.md
{
  echo "<!-- compare_mpi:begin -->"
  echo "## collie vs Open MPI (bench/compare_mpi.sh)"
  echo
  echo "Run of $started on $(nproc) cores ($(uname -sr)), $(mpirun --version 2>/dev/null | head -1),"
  echo "collie-perf and mpi-perf from \`$(basename "$build")\`; the whole script took ${elapsed} s."
  echo "Command: \`bench/compare_mpi.sh $(basename "$build")\`"
  echo "(RANKS=\"${ranks[*]}\" OPS=\"${ops[*]}\" TRANSPORTS=\"${transports[*]}\" CHECK=$check)."
  echo
  echo "Both programs share tools/perf_common.c: same sizes, same warm-up, a barrier, then"
  echo "back-to-back calls timed with CLOCK_MONOTONIC; the time is the mean over ranks (-a 1)."
  echo "float, sum, out-of-place columns. Iterations per size: 8 B-64 KiB: 50 (5 warm-up),"
  echo "128 KiB-4 MiB: 10 (2), 8-256 MiB: 3 (1). busbw follows nccl-tests (allreduce"
  echo "2(n-1)/n, allgather (n-1)/n, broadcast 1); \"collie/MPI\" is the busbw ratio, computed"
  echo "from the times (MPI time / collie time), above 1 when collie is faster."
  echo "Single runs on a shared 2-core machine: read the trends, not the last digit."
  echo
  echo "Commands, shown for the 8-256 MiB band (the other bands differ in -b, -e, -n, -w):"
  echo
  for tr in "${transports[@]}"; do
    for lib in collie mpi; do
      echo "    $(launcher $lib "$tr" N | sed "s|$build/||g; s|-np N|-np N|") $(perf_args OP "${bands[2]}")"
    done
  done
  echo
  for tr in "${transports[@]}"; do
    for n in "${ranks[@]}"; do
      echo "### ${tr}, $n ranks"
      echo
      [ $plot = 1 ] && echo "![busbw vs size, ${tr}, $n ranks](plots/compare_mpi_${tr}_n${n}.png)" && echo
      for op in "${ops[@]}"; do
        c="$out/collie_${tr}_${n}_${op}"
        m="$out/mpi_${tr}_${n}_${op}"
        echo "#### $op, ${tr}, $n ranks"
        echo
        note=""
        [ "$(cat "$c.rc")" != 0 ] && note+="collie-perf exited with status $(cat "$c.rc") (log: $(basename "$build")/compare_mpi/$(basename "$c").log). "
        [ "$(cat "$m.rc")" != 0 ] && note+="mpi-perf exited with status $(cat "$m.rc") (log: $(basename "$build")/compare_mpi/$(basename "$m").log). "
        [ -n "$note" ] && echo "$note" && echo
        echo "| size (B) | collie time (us) | collie busbw (GB/s) | MPI time (us) | MPI busbw (GB/s) | collie/MPI |"
        echo "|---:|---:|---:|---:|---:|---:|"
        awk 'FNR == 1 { f++ }
             f == 1 { ct[$1] = $2; cb[$1] = $3; s[$1] = 1 }
             f == 2 { mt[$1] = $2; mb[$1] = $3; s[$1] = 1 }
             END {
               n = 0; for (k in s) keys[++n] = k + 0
               for (i = 2; i <= n; i++) { v = keys[i]; j = i - 1; while (j > 0 && keys[j] > v) { keys[j + 1] = keys[j]; j-- } keys[j + 1] = v }
               for (i = 1; i <= n; i++) {
                 k = keys[i] ""
                 r = (k in ct && k in mt && ct[k] > 0) ? sprintf("%.2f", mt[k] / ct[k]) : "-"
                 printf "| %s | %s | %s | %s | %s | %s |\n", k, (k in ct ? ct[k] : "-"), (k in cb ? cb[k] : "-"),
                        (k in mt ? mt[k] : "-"), (k in mb ? mb[k] : "-"), r
               }
             }' "$c.dat" "$m.dat"
        echo
      done
    done
  done
  echo "<!-- compare_mpi:end -->"
} >"$section"

doc=$here/docs/BENCHMARKS.md
[ -f "$doc" ] || printf '# Benchmarks\n' >"$doc"
if grep -q '<!-- compare_mpi:begin -->' "$doc" && grep -q '<!-- compare_mpi:end -->' "$doc"; then
  awk -v sec="$section" '
    /<!-- compare_mpi:begin -->/ { while ((getline line < sec) > 0) print line; skip = 1; next }
    /<!-- compare_mpi:end -->/ { skip = 0; next }
    !skip { print }' "$doc" >"$doc.tmp" && mv "$doc.tmp" "$doc"
else
  { echo; cat "$section"; } >>"$doc"
fi
echo "compare_mpi: ${elapsed} s; wrote $doc (section compare_mpi) and docs/plots/compare_mpi_*.png; logs in $out"

# Non-zero when any run failed, after writing what was measured.
status=0
for f in "$out"/*.rc; do [ "$(cat "$f")" = 0 ] || status=1; done
exit $status
