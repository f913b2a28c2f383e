#!/usr/bin/env bash
# Checks the exported symbol set of a built libcollie against NVIDIA's nccl.h:
#  1. every function NVIDIA's header declares (nccl* and pnccl*) is exported
#     as a defined function;
#  2. each nccl* export and its pnccl* twin are the same code (one address);
#  3. nothing else leaks: only nccl*, pnccl* and collie_* names (plus the few
#     symbols the linker adds itself) are exported;
#  4. collie's include/nccl.h and tests/abi/api_functions.inc name exactly the
#     functions NVIDIA's header names, so the other ABI tests cover them all.
#
# Usage: check_symbols.sh LIBCOLLIE [NVIDIA_NCCL_H]
#   NVIDIA_NCCL_H defaults to $NVIDIA_NCCL_H, then /usr/local/cuda/include/nccl.h.
#   CPP (default "cc -E") must accept -fpreprocessed (gcc, clang).
# Exit status: 0 all checks passed, 1 a check failed, 2 usage/setup error.
set -u

lib=${1:-}
hdr=${2:-${NVIDIA_NCCL_H:-/usr/local/cuda/include/nccl.h}}
here=$(cd "$(dirname "$0")" && pwd)
ours_hdr="$here/../../include/nccl.h"
func_list="$here/api_functions.inc"
cpp=${CPP:-cc -E}

if [ -z "$lib" ] || [ ! -f "$lib" ]; then
  echo "usage: $0 LIBCOLLIE [NVIDIA_NCCL_H]" >&2
  exit 2
fi
if [ ! -f "$hdr" ]; then
  echo "check_symbols: NVIDIA header not found: $hdr" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Function names a header declares: strip comments (-fpreprocessed removes
# them without expanding macros or following includes), drop directives, and
# keep every nccl*/pnccl* identifier that is followed by '('.
declared_names() {
  $cpp -fpreprocessed -dD -P -x c "$1" 2>/dev/null |
    grep -v '^[[:space:]]*#' |
    grep -oE '(^|[^A-Za-z0-9_])p?nccl[A-Za-z0-9_]*[[:space:]]*\(' |
    sed -E 's/^[^A-Za-z0-9_]//; s/[[:space:]]*\($//' |
    sort -u
}

declared_names "$hdr" > "$tmp/api"
n_api=$(wc -l < "$tmp/api")
if [ "$n_api" -lt 2 ]; then
  echo "check_symbols: found no function declarations in $hdr (is \$CPP a C preprocessor?)" >&2
  exit 2
fi

fail=0
report() { # title, file with offending lines
  if [ -s "$2" ]; then
    echo "FAIL: $1:"
    sed 's/^/  /' "$2"
    fail=1
  fi
}

# The library's dynamic symbol table: "address type name", version suffix
# (name@@VERSION) removed.
nm -D --defined-only "$lib" |
  awk 'NF == 3 { sub(/@.*/, "", $3); print $1, $2, $3 }' | sort -k3,3 -u > "$tmp/exports"
if [ ! -s "$tmp/exports" ]; then
  echo "check_symbols: nm found no dynamic symbols in $lib" >&2
  exit 2
fi

# 1. Every API function exported, as code (T text, W weak, i ifunc).
awk 'NR == FNR { api[$1] = 1; next }
     ($2 == "T" || $2 == "W" || $2 == "i") { have[$3] = 1 }
     END { for (f in api) if (!(f in have)) print f }' "$tmp/api" "$tmp/exports" |
  sort > "$tmp/missing"
report "functions of $hdr not exported by $lib" "$tmp/missing"

# 2. nccl<Name> and pnccl<Name> share an address.
awk 'NR == FNR { api[$1] = 1; next }
     { addr[$3] = $1 }
     END {
       for (f in api) {
         if (f !~ /^nccl/ || !(f in addr) || !(("p" f) in addr)) continue
         if (addr[f] != addr["p" f]) print f " at " addr[f] ", p" f " at " addr["p" f]
       }
     }' "$tmp/api" "$tmp/exports" | sort > "$tmp/split"
report "nccl*/pnccl* pairs that are not one function" "$tmp/split"

# 3. No foreign exports. Absolute (A) symbols are version-node names from a
# linker version script, not code or data.
awk '$2 == "A" { next }
     $3 ~ /^(nccl|pnccl|collie_)/ { next }
     $3 ~ /^(_init|_fini|_edata|_end|__bss_start)$/ { next }
     { print $3 " (" $2 ")" }' "$tmp/exports" > "$tmp/foreign"
report "symbols exported outside the nccl*/pnccl*/collie_* namespace" "$tmp/foreign"

# 4. collie's header and the test list cover the same functions.
if [ -f "$ours_hdr" ]; then
  declared_names "$ours_hdr" > "$tmp/ours"
  comm -23 "$tmp/api" "$tmp/ours" > "$tmp/hdr_missing"
  comm -13 "$tmp/api" "$tmp/ours" > "$tmp/hdr_extra"
  report "functions NVIDIA's nccl.h declares that include/nccl.h does not" "$tmp/hdr_missing"
  report "functions include/nccl.h declares that NVIDIA's nccl.h does not" "$tmp/hdr_extra"
fi
if [ -f "$func_list" ]; then
  grep -oE '^X\(nccl[A-Za-z0-9_]*\)' "$func_list" | sed -E 's/^X\((.*)\)$/\1/' |
    awk '{ print; print "p" $0 }' | sort -u > "$tmp/list"
  comm -23 "$tmp/api" "$tmp/list" > "$tmp/list_missing"
  comm -13 "$tmp/api" "$tmp/list" > "$tmp/list_extra"
  report "functions missing from tests/abi/api_functions.inc" "$tmp/list_missing"
  report "names in tests/abi/api_functions.inc that NVIDIA's nccl.h lacks" "$tmp/list_extra"
fi

n_exports=$(wc -l < "$tmp/exports")
if [ "$fail" -ne 0 ]; then
  echo "check_symbols: FAILED ($lib against $hdr)"
  exit 1
fi
echo "check_symbols: passed: $n_api API functions exported, $n_exports exports all in the nccl*/pnccl*/collie_* namespace"
exit 0
