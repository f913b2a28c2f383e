#!/usr/bin/env bash
# collie against Open MPI, side by side, in one run: collie-perf (under
# collie-run) and mpi-perf (under mpirun) time the same operations at the same
# sizes with the same method (tools/perf_common.c). Every collective both have,
# 8 B .. 256 MiB in steps of 4, over shared memory at 2/4/8 ranks and over TCP
# at 2 ranks; collie both unbound (nothing binds: --bind-to none sets
# COLLIE_BIND=none, as when a job with compute threads is left unbound; a plain
# fork of a program without thread pools gets the library's COLLIE_BIND=auto
# placement instead) and bound (one disjoint core share per rank), Open MPI
# with its default binding.
# Rounds are interleaved (round 1 of every series, then round 2 ...) and each
# cell is the median over rounds. Writes the table of ratios (Open MPI time /
# collie time: above 1 when collie is faster), a ratio-vs-size plot per
# configuration, and the list of cells below 1.0 into docs/BENCHMARKS.md
# between the markers <!-- SECTION:begin --> / <!-- SECTION:end -->.
#
# Usage: bench/compare_mpi.sh [BUILD_DIR]      (default: build)
# Environment:
#   CONFIGS="shm:2 shm:4 shm:8 tcp:2"   transport:ranks pairs
#   OPS="all_reduce all_gather broadcast reduce reduce_scatter alltoall"
#   ROUNDS=3     interleaved rounds per series (medians over them)
#   MODES="unbound bound"   collie's placements
#   HOG=0        1: one busy process (a shell loop) runs beside every series
#   SECTION      marker name in docs/BENCHMARKS.md (default compare_mpi, or
#                compare_mpi_hog with HOG=1); DOC=0 writes nothing to docs/
#   CHECK=0      collie-perf/mpi-perf -c (the test suite checks results)
#   QUICK=1      only 8 B .. 2 KiB, to try the script
#   MID=1        the sizes between the sweep's points instead (16 B .. 64 MiB,
#                steps of 4 from 16 B: each a factor 2 from its neighbours in
#                the sweep), with each band's calls; with the default sweep it
#                makes the whole range in steps of 2 (use with DOC=0)
#   CONFIRM=6    after the sweep, every cell below 1.0 is timed again: this
#                many more interleaved rounds of that size alone (collie in
#                that placement, then Open MPI, with the hog when HOG=1); the
#                list of misses gives the ratio of the medians over all rounds
#                and the range of the rounds' ratios. The table keeps the
#                sweep's medians. 0: no confirmation.
#   SWEEP=1      0: no sweep; reuse the rounds already in the output folder
#                (same build, same settings) and only confirm and write
#
# "shm" is collie's shared memory vs Open MPI's vader BTL; "tcp" is collie's
# socket transport (NCCL_HOSTID per rank: every rank a host of its own) vs Open
# MPI's tcp BTL, both on loopback; Open MPI is pinned to the ob1 PML.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" 2>/dev/null && pwd) || { echo "compare_mpi: no build folder '${1:-build}'" >&2; exit 2; }
read -r -a configs <<<"${CONFIGS:-shm:2 shm:4 shm:8 tcp:2}"
read -r -a ops <<<"${OPS:-all_reduce all_gather broadcast reduce reduce_scatter alltoall}"
read -r -a modes <<<"${MODES:-unbound bound}"
rounds=${ROUNDS:-3}
hog=${HOG:-0}
section_name=${SECTION:-compare_mpi$([ "$hog" = 1 ] && echo _hog)$([ "${MID:-0}" = 1 ] && echo _mid)}
check=${CHECK:-0}
confirm=${CONFIRM:-6}
sweep=${SWEEP:-1}
# -b -e -f -n -w -M per band: few iterations where one call takes long. The
# warm-up of the small bands covers collie's 64-slot one-shot mailbox ring (the
# first use of each slot's page costs a fault; with 5 warm-up calls 128 B
# allreduce timed 5 us instead of 0.17) and is the same for Open MPI. -M: at
# least 30 ms timed per size in the two small bands (40 calls of 0.1 us were
# a 4 us loop, where one preemption or wake-up decided the cell, and fewer
# calls than the one-shot's 64 slots, so a root that runs ahead never waited
# for a slot); for both libraries alike. The large bands' warm-up: on this
# machine the first calls of a process at 8 MiB and more are slow for both
# libraries alike, whatever the library does (the CPU time of the kernel's
# copies falls from call to call), and a band that timed the 2nd-5th calls
# measured that ramp: call k+1 alone (-n 1 -w k, 4-5 launches each, ms, collie
# / Open MPI), 4-rank alltoall 8 MiB: k=1 3.0-3.3 / 2.9-4.3, k=2 2.0-2.4 /
# 1.8-3.3, k=4 1.6-2.1 / 1.5-3.0, k=8 1.42-1.46 / 1.37-1.87; 2-rank allreduce
# 8 MiB: k=1 1.59-1.75 / 3.90-3.97, k=4 1.17-1.30 / 1.75-1.82; 2-rank alltoall
# 128 MiB (3 launches): k=1 27.2-28.7 / 25.5-26.3, k=2 23.9-24.5 / 23.1-25.1,
# k=4 21.9-23.6 / 23.2-23.8. A training loop calls a collective thousands of
# times; nccl-tests warms up with 5 calls.
bands=("8 32K 4 40 100 30" "128K 2M 4 10 70 30" "8M 32M 4 4 5 0" "128M 256M 2 2 3 0")
# QUICK=1: a smoke run of the script itself (8 B .. 2 KiB, few iterations).
[ "${QUICK:-0}" = 1 ] && bands=("8 2K 4 10 2 0")
[ "${MID:-0}" = 1 ] && bands=("16 64K 4 40 100 30" "256K 4M 4 10 70 30" "16M 64M 4 4 5 0")
per_run_timeout=900

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
out=$build/$section_name
if [ "$sweep" = 1 ]; then
  rm -rf "$out"
elif ! ls "$out"/*.r1 >/dev/null 2>&1; then
  echo "compare_mpi: SWEEP=0 but $out holds no rounds" >&2
  exit 2
fi
rm -f "$out"/confirm.*
plots=$here/docs/plots
[ "${DOC:-1}" = 1 ] || plots=$out # a trial run leaves docs/ alone
mkdir -p "$out" "$plots"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t_start=$(date +%s)

hog_pid=""
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null; hog_pid=""; }
start_hog() {
  [ "$hog" = 1 ] || return 0
  sh -c 'while :; do :; done' &
  hog_pid=$!
}
trap stop_hog EXIT INT TERM

# collie-run binds ranks itself when it knows --bind-to; an older one gets a
# taskset wrapper that gives each local rank one core.
if "$build/collie-run" --help 2>&1 | grep -q -- '--bind-to'; then
  bind_native=1
else
  bind_native=0
fi

perf_args() { # OP BAND -> the common benchmark arguments
  local b e f n w m
  read -r b e f n w m <<<"$2"
  echo "$1 -b $b -e $e -f $f -n $n -w $w -M ${m:-0} -c $check -d float -o sum"
}

# Prints the command line for LIB(collie-MODE|mpi) TRANSPORT N; the benchmark
# arguments follow it.
launcher() {
  local lib=$1 tr=$2 n=$3 run wrap=""
  if [ "$lib" = mpi ]; then
    local btl="self,vader"
    [ "$tr" = tcp ] && btl="self,tcp --mca btl_tcp_if_include lo"
    echo "mpirun --allow-run-as-root --oversubscribe -np $n --mca pml ob1 --mca btl $btl $build/mpi-perf"
    return
  fi
  run="$build/collie-run -n $n"
  case "$lib" in
    collie-bound)
      # collie-run's default placement: a disjoint share of the cores per rank
      # (none when there are more ranks than cores, as mpirun's default).
      [ $bind_native = 1 ] || wrap="taskset -c \$((COLLIE_LOCAL_RANK % $(nproc))) " ;;
    collie-unbound)
      [ $bind_native = 1 ] && run+=" --bind-to none" ;;
  esac
  local hostid=""
  [ "$tr" = tcp ] && hostid="NCCL_HOSTID=h\$COLLIE_RANK "
  if [ -n "$wrap$hostid" ]; then
    echo "$run sh -c '${hostid}exec ${wrap}\"\$0\" \"\$@\"' $build/collie-perf"
  else
    echo "$run $build/collie-perf"
  fi
}

libs=()
for m in "${modes[@]}"; do libs+=("collie-$m"); done
libs+=(mpi)

# One series: LIB TRANSPORT N OP ROUND -> "size time" rows in
# $out/LIB_TR_N_OP.rROUND: out-of-place, except broadcast in place. MPI_Bcast
# has one buffer (mpi-perf's out-of-place broadcast sends from the root's send
# buffer and leaves its receive buffer alone), while an out-of-place
# ncclBroadcast also copies the root's send buffer into its receive buffer;
# in place both do exactly the same work.
run_series() {
  local lib=$1 tr=$2 n=$3 op=$4 r=$5 key="$1_$2_$3_$4" band rc=0 col=6
  [ "$op" = broadcast ] && col=10
  : >"$out/$key.r$r"
  for band in "${bands[@]}"; do
    local cmd
    cmd="$(launcher "$lib" "$tr" "$n") $(perf_args "$op" "$band")"
    echo "\$ $cmd" >>"$out/$key.log"
    timeout -k 10 "$per_run_timeout" bash -c "$cmd" >"$out/$key.band" 2>&1
    local s=$?
    cat "$out/$key.band" >>"$out/$key.log"
    [ $s -ne 0 ] && rc=$s
    # Size 0: the sweep's smallest size split over more ranks than it has
    # elements (8 B all_gather at 4 ranks); a no-op on both sides, not a cell.
    awk -v col=$col '$1 ~ /^[0-9]+$/ && $1 > 0 && NF >= 13 { print $1, $col }' "$out/$key.band" >>"$out/$key.r$r"
  done
  rm -f "$out/$key.band"
  [ $rc -ne 0 ] && echo "$rc" >"$out/$key.failed"
  printf 'compare_mpi: round %d %-15s %s n=%d %-14s exit %d\n' "$r" "$lib" "$tr" "$n" "$op" "$rc"
}

if [ "$sweep" = 1 ]; then
  start_hog
  for r in $(seq 1 "$rounds"); do
    for cfg in "${configs[@]}"; do
      tr=${cfg%%:*}; n=${cfg##*:}
      for op in "${ops[@]}"; do
        for lib in "${libs[@]}"; do run_series "$lib" "$tr" "$n" "$op" "$r"; done
      done
    done
  done
  stop_hog
  echo "$(($(date +%s) - t_start))" >"$out/elapsed"
  echo "$started" >"$out/started"
else
  # The rounds already there: as many as the first series has.
  rounds=$(ls "$out"/*.r[0-9]* | sed 's/.*\.r//' | sort -n | tail -1)
  started=$(cat "$out/started" 2>/dev/null || echo "$started")
fi
elapsed=$(cat "$out/elapsed" 2>/dev/null || echo "$(($(date +%s) - t_start))")

# awk: the median of a[1..n] (sorts a by value; an odd count returns the element as it was written).
awk_median='function med(a, n,   i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; j = i - 1
    while (j > 0 && a[j] + 0 > x + 0) { a[j + 1] = a[j]; j-- } a[j + 1] = x }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }'

# Medians over rounds: $out/LIB_TR_N_OP.med holds "size median_us".
for f in "$out"/*.r1; do
  key=${f%.r1}
  cat "$key".r* | awk "$awk_median"'
    { v[$1] = v[$1] " " $2 }
    END { for (s in v) { n = split(v[s], a, " "); print s, med(a, n) } }' |
    sort -n >"$key.med"
done

# The ratio table for one configuration: rows are sizes, a column per op, each
# cell "unbound / bound" (MPI median time / collie median time).
ratio_table() {
  local tr=$1 n=$2 op lib
  printf '| size (B) |'; for op in "${ops[@]}"; do printf ' %s |' "$op"; done; echo
  printf '|---:|'; for op in "${ops[@]}"; do printf '%s' '---:|'; done; echo
  local files=()
  for op in "${ops[@]}"; do
    files+=("$out/mpi_${tr}_${n}_${op}.med")
    for lib in "${libs[@]}"; do [ "$lib" = mpi ] || files+=("$out/${lib}_${tr}_${n}_${op}.med"); done
  done
  local per=$(( ${#libs[@]} ))
  awk -v per="$per" -v nops="${#ops[@]}" '
    FNR == 1 { f++ }
    { t[f, $1] = $2; sizes[$1] = 1 }
    END {
      ns = 0; for (s in sizes) keys[++ns] = s + 0
      for (i = 2; i <= ns; i++) { v = keys[i]; j = i - 1; while (j > 0 && keys[j] > v) { keys[j + 1] = keys[j]; j-- } keys[j + 1] = v }
      for (i = 1; i <= ns; i++) {
        s = keys[i] ""; line = "| " s " |"
        for (o = 0; o < nops; o++) {
          m = o * per + 1; cell = ""
          for (k = 1; k < per; k++) {
            c = m + k
            r = ((m, s) in t && (c, s) in t && t[c, s] > 0) ? sprintf("%.2f", t[m, s] / t[c, s]) : "-"
            if (r != "-" && r + 0 < 1.0) r = "**" r "**"
            cell = cell (k > 1 ? " / " : "") r
          }
          line = line " " cell " |"
        }
        print line
      }
    }' "${files[@]}"
}

# Every cell below 1.0, one per line: "TR N OP SIZE MODE RATIO COLLIE_US MPI_US".
miss_rows() {
  local cfg tr n op lib
  for cfg in "${configs[@]}"; do
    tr=${cfg%%:*}; n=${cfg##*:}
    for op in "${ops[@]}"; do
      for lib in "${libs[@]}"; do
        [ "$lib" = mpi ] && continue
        awk -v tr="$tr" -v n="$n" -v op="$op" -v mode="${lib#collie-}" 'FNR == 1 { f++ }
          f == 1 { m[$1] = $2 } f == 2 && ($1 in m) && $2 > 0 && m[$1] / $2 < 1.0 {
            printf "%s %s %s %s %s %.2f %s %s\n", tr, n, op, $1, mode, m[$1] / $2, $2, m[$1] }' \
          "$out/mpi_${tr}_${n}_${op}.med" "$out/${lib}_${tr}_${n}_${op}.med"
      done
    done
  done
}

# A size in words: 8 B, 32 KiB, 2 MiB.
size_words() {
  local v u
  v=$(numfmt --from=iec "$1")
  for u in B KiB MiB GiB; do
    if [ "$u" = GiB ] || [ $((v % 1024)) -ne 0 ]; then
      echo "$v $u"
      return
    fi
    v=$((v / 1024))
  done
}

# The bands in words: "8 B-32 KiB 40 (100), more where needed for 30 ms ...; ...".
band_text() {
  local band b e f n w m out="" sep=""
  for band in "${bands[@]}"; do
    read -r b e f n w m <<<"$band"
    out+="$sep$(size_words "$b")-$(size_words "$e") $n ($w)"
    [ "${m:-0}" != 0 ] && out+=", more where needed for $m ms timed (\`-M $m\`)"
    sep="; "
  done
  echo "$out (\`-M\`: the slowest rank's warm-up decides the count)"
}

# The sweep's -n -w -M for one size (its band's).
size_args() {
  local s=$1 band b e f n w m
  for band in "${bands[@]}"; do
    read -r b e f n w m <<<"$band"
    if [ "$s" -ge "$(numfmt --from=iec "$b")" ] && [ "$s" -le "$(numfmt --from=iec "$e")" ]; then
      echo "$s $s $f $n $w $m"
      return
    fi
  done
  echo "$s $s 4 4 1 0"
}

# Confirmation: CONFIRM more interleaved rounds of each missed cell alone,
# collie in the cell's placement then Open MPI. $out/confirm.raw gets
# "TR N OP SIZE MODE LIB ROUND TIME_US" rows.
confirm_misses() {
  local tr n op s mode rest r lib cmd t col
  [ "$confirm" -gt 0 ] || return 0
  miss_rows >"$out/confirm.cells"
  [ -s "$out/confirm.cells" ] || return 0
  start_hog
  for r in $(seq 1 "$confirm"); do
    while read -r tr n op s mode rest; do
      col=6
      [ "$op" = broadcast ] && col=10
      for lib in "collie-$mode" mpi; do
        cmd="$(launcher "$lib" "$tr" "$n") $(perf_args "$op" "$(size_args "$s")")"
        echo "\$ $cmd" >>"$out/confirm.log"
        t=$(timeout -k 10 "$per_run_timeout" bash -c "$cmd" </dev/null 2>&1 | tee -a "$out/confirm.log" |
          awk -v s="$s" -v col=$col '$1 == s && NF >= 13 { print $col }')
        echo "$tr $n $op $s $mode $lib $r ${t:-NA}" >>"$out/confirm.raw"
      done
    done <"$out/confirm.cells"
    echo "compare_mpi: confirmation round $r of $confirm ($(wc -l <"$out/confirm.cells") cells)"
  done
  stop_hog
}

# One missed cell over all its rounds (the sweep's and the confirmation's):
# "RATIO_OF_MEDIANS COLLIE_MED MPI_MED LOWEST_ROUND_RATIO HIGHEST NROUNDS
# NAHEAD", the ratio in bold below 1.0; NAHEAD: the rounds where collie took
# less time than Open MPI in the same round (a cell whose medians miss while
# collie is ahead in about half of its rounds is a tie within the noise).
confirmed() {
  local tr=$1 n=$2 op=$3 s=$4 mode=$5
  {
    for f in "$out/collie-${mode}_${tr}_${n}_${op}".r[0-9]*; do
      r=${f##*.r}
      awk -v s="$s" -v r="$r" '$1 == s { print "c", r, $2 }' "$f"
      awk -v s="$s" -v r="$r" '$1 == s { print "m", r, $2 }' "$out/mpi_${tr}_${n}_${op}.r$r"
    done
    awk -v k="$tr $n $op $s $mode" '$1 " " $2 " " $3 " " $4 " " $5 == k && $8 != "NA" {
      print ($6 == "mpi" ? "m" : "c"), "x" $7, $8 }' "$out/confirm.raw" 2>/dev/null
  } | awk "$awk_median"'
    $1 == "c" { c[++nc] = $3; cr[$2] = $3 + 0 } $1 == "m" { m[++nm] = $3; mr[$2] = $3 + 0 }
    END {
      if (!nc || !nm) exit
      lo = 1e9; hi = 0; k = 0; w = 0
      for (r in cr) if ((r in mr) && cr[r] > 0) {
        q = mr[r] / cr[r]; if (q < lo) lo = q; if (q > hi) hi = q; k++; if (q > 1.0) w++
      }
      cm = med(c, nc); mm = med(m, nm)
      q = sprintf("%.2f", mm / cm)
      if (q + 0 < 1.0) q = "**" q "**"
      printf "%s %s %s %.2f %.2f %d %d\n", q, cm, mm, lo, hi, k, w
    }'
}

# The misses as the document lists them, each with its confirmation.
misses() {
  local tr n op s mode ratio cus mus conf
  while read -r tr n op s mode ratio cus mus; do
    printf -- '- %s %s ranks, %s %s B, %s: %s (collie %s us, MPI %s us)' "$tr" "$n" "$op" "$s" "$mode" "$ratio" "$cus" "$mus"
    conf=""
    [ -s "$out/confirm.raw" ] && conf=$(confirmed "$tr" "$n" "$op" "$s" "$mode")
    if [ -n "$conf" ]; then
      read -r cr cm mm lo hi k w <<<"$conf"
      printf '; over %d rounds: %s (collie %s us, MPI %s us), rounds %s-%s, collie ahead in %d of %d' "$k" "$cr" "$cm" \
        "$mm" "$lo" "$hi" "$w" "$k"
    fi
    echo
  done < <(miss_rows)
}

confirm_misses

if [ $plot = 1 ]; then
  for cfg in "${configs[@]}"; do
    tr=${cfg%%:*}; n=${cfg##*:}
    png="$plots/${section_name}_${tr}_n${n}.png"
    {
      echo "set terminal pngcairo size 960,600 font ',10' noenhanced"
      echo "set output '$png'"
      echo "set title 'Open MPI time / collie time, $n ranks, $tr$([ "$hog" = 1 ] && echo ', CPU hog') (solid: unbound, dashed: bound) - $started'"
      echo "set logscale x 2; set format x '%.0b%B'; set xlabel 'size (bytes)'; set logscale y 2"
      echo "set ylabel 'ratio (above 1: collie faster)'; set grid; set key outside right"
      printf 'plot 1 with lines lc rgb "black" lw 2 title "even"'
      color=1
      for op in "${ops[@]}"; do
        dt=1
        for lib in "${libs[@]}"; do
          [ "$lib" = mpi ] && continue
          printf ", '< join %s %s' using 1:(\$2/\$3) with linespoints lw 2 dt %d lc %d pt 7 ps 0.5 title '%s %s'" \
            "$out/mpi_${tr}_${n}_${op}.med" "$out/${lib}_${tr}_${n}_${op}.med" $dt $color "$op" "${lib#collie-}"
          dt=2
        done
        color=$((color + 1))
      done
      echo
    } >"$out/plot_${tr}_${n}.gp"
    gnuplot "$out/plot_${tr}_${n}.gp" 2>>"$out/gnuplot.log" || echo "compare_mpi: gnuplot failed ($out/gnuplot.log)" >&2
  done
fi

section=$out/section.md
{
  echo "<!-- $section_name:begin -->"
  echo "## collie vs Open MPI$([ "$hog" = 1 ] && echo ', one CPU hog beside the ranks')$([ "${MID:-0}" = 1 ] && echo ', the sizes between the sweep'"'"'s points') (bench/compare_mpi.sh)"
  echo
  echo "Run of $started on $(nproc) cores ($(uname -sr)), $(mpirun --version 2>/dev/null | head -1);"
  echo "the whole script took ${elapsed} s. Command: \`$([ "$hog" = 1 ] && echo 'HOG=1 ')$([ "${MID:-0}" = 1 ] && echo 'MID=1 ')bench/compare_mpi.sh $(basename "$build")\`"
  echo "(CONFIGS=\"${configs[*]}\" OPS=\"${ops[*]}\" ROUNDS=$rounds MODES=\"${modes[*]}\")."
  echo
  echo "Each cell: Open MPI time / collie time, medians of $rounds interleaved rounds, float sum,"
  echo "out-of-place (broadcast in place: MPI_Bcast has one buffer, and an out-of-place ncclBroadcast"
  echo "also copies the root's send buffer into its receive buffer, which MPI_Bcast never does; the"
  echo "out-of-place times are in the raw logs); above 1 when collie is faster, below 1 in bold. Two figures per cell:"
  echo "collie ${modes[*]} (\"unbound\": \`collie-run --bind-to none\`, which also sets COLLIE_BIND=none:"
  echo "nothing binds, the scheduler places the ranks; \"bound\": collie-run's default binding, a disjoint share of the cores per rank, none with more ranks than cores$([ $bind_native = 0 ] && echo ' (taskset wrapper: this collie-run has no --bind-to)')); Open MPI with its default binding"
  echo "(\`mpirun --oversubscribe\`, ob1, vader or tcp BTL). Timing: tools/perf_common.c for both"
  echo "(barrier, then back-to-back calls, mean over ranks). Calls per size (warm-up): $(band_text)."
  echo "Medians and raw logs: \`$(basename "$build")/$section_name/\`."
  echo
  for cfg in "${configs[@]}"; do
    tr=${cfg%%:*}; n=${cfg##*:}
    echo "### $tr, $n ranks"
    echo
    [ $plot = 1 ] && echo "![ratio vs size, $tr, $n ranks](plots/${section_name}_${tr}_n${n}.png)" && echo
    ratio_table "$tr" "$n"
    echo
  done
  failed=$(ls "$out"/*.failed 2>/dev/null | xargs -r -n1 basename | sed 's/\.failed$//' | tr '\n' ' ')
  [ -n "$failed" ] && echo "Series with a failed run (see their .log): $failed" && echo
  misses >"$out/misses.md"
  nmiss=$(wc -l <"$out/misses.md")
  ncells=$(( ${#configs[@]} * ${#ops[@]} * ${#modes[@]} * $(wc -l <"$(ls "$out"/mpi_*.med | head -1)") ))
  echo "Cells below 1.0: $nmiss of $ncells."
  if [ -s "$out/confirm.raw" ]; then
    nconf=$(grep -c 'over [0-9]* rounds: \*\*' "$out/misses.md")
    echo "Each was timed again, $confirm more interleaved rounds of that size alone (\`CONFIRM=$confirm\`:"
    echo "collie in that placement, then Open MPI$([ "$hog" = 1 ] && echo ', the hog beside them')); over all rounds, the ratio of"
    echo "the medians stays below 1.0 for $nconf of them (in bold), and \"rounds\" is the range of the"
    echo "single rounds' ratios (collie's round against Open MPI's of the same round); \"collie ahead in"
    echo "W of K\" counts the rounds whose ratio is above 1.0."
  fi
  echo
  cat "$out/misses.md"
  echo
  echo "<!-- $section_name:end -->"
} >"$section"

if [ "${DOC:-1}" = 1 ]; then
  doc=$here/docs/BENCHMARKS.md
  [ -f "$doc" ] || printf '# Benchmarks\n' >"$doc"
  if grep -q "<!-- $section_name:begin -->" "$doc" && grep -q "<!-- $section_name:end -->" "$doc"; then
    awk -v sec="$section" -v b="<!-- $section_name:begin -->" -v e="<!-- $section_name:end -->" '
      $0 == b { while ((getline line < sec) > 0) print line; skip = 1; next }
      $0 == e { skip = 0; next }
      !skip { print }' "$doc" >"$doc.tmp" && mv "$doc.tmp" "$doc"
  else
    { echo; cat "$section"; } >>"$doc"
  fi
  echo "compare_mpi: ${elapsed} s; wrote $doc (section $section_name); logs in $out"
else
  cat "$section"
fi
status=0
ls "$out"/*.failed >/dev/null 2>&1 && status=1
exit $status
