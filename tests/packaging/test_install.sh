#!/usr/bin/env bash
# Installs a build into a temporary prefix and builds programs against it the
# three ways users do: pkg-config, find_package(collie) (shared and static),
# and plain -lnccl (the libnccl.so.2 drop-in). Usage: test_install.sh BUILD_DIR
set -u
build=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
check() { if "$@" >"$tmp/out" 2>&1; then echo "ok - $*"; pass=$((pass+1)); else echo "not ok - $*"; sed 's/^/    /' "$tmp/out" | tail -20; fail=$((fail+1)); fi; }
prefix=$tmp/prefix
check cmake --install "$build" --prefix "$prefix"
libdir=$(ls -d "$prefix"/lib* | head -1)
for f in "$libdir/libcollie.so.0" "$libdir/libcollie.a" "$libdir/libnccl.so.2" "$prefix/include/nccl.h" \
         "$prefix/include/collie.h" "$libdir/pkgconfig/collie.pc" "$libdir/cmake/collie/collieConfig.cmake" \
         "$prefix/bin/collie-run"; do
  check test -e "$f"
done
check sh -c "readelf -d '$libdir/libcollie.so.0' | grep -q 'SONAME.*libcollie.so.0'"
export NCCL_SOCKET_IFNAME=lo LD_LIBRARY_PATH=$libdir
check sh -c "cc -o '$tmp/pc' '$here/consumer.c' \$(PKG_CONFIG_PATH='$libdir/pkgconfig' pkg-config --cflags --libs collie) && '$tmp/pc'"
# As a program written for NVIDIA's NCCL links it: -lnccl, resolved to collie.
mkdir -p "$tmp/nccl"; ln -s "$libdir/libnccl.so.2" "$tmp/nccl/libnccl.so"
check sh -c "cc -o '$tmp/ln' '$here/consumer.c' -I'$prefix/include' -L'$tmp/nccl' -lnccl && '$tmp/ln'"
mkdir -p "$tmp/proj"; cp "$here/consumer.c" "$tmp/proj/"; cp "$here/CMakeLists.txt.in" "$tmp/proj/CMakeLists.txt"
check cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$prefix"
check cmake --build "$tmp/proj/build"
check "$tmp/proj/build/consumer_cmake"
check "$tmp/proj/build/consumer_static"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
