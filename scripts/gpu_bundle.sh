#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs into one folder, so a GPU machine that
# should not spend its time compiling gets prebuilt binaries:
#   PREFIX/lib  libcollie.so.0 (+ libnccl.so.2 naming it), the shared
#               libraries it needs that a bare machine may lack (hwloc, udev),
#               libvdev.so (tests/gpu/vdev_shim.c)
#   PREFIX/bin  the GPU tests (gpu_test_coll, gpu_test_extra, gpu_abi_device)
#               and gpu-perf (bench/gpu_perf.c); both it and the clients ask
#               for libcollie.so.0, and gpu_check.sh runs them against
#               NVIDIA's NCCL through a folder where that name points at it
#   PREFIX/nt   client binaries (e.g. nccl-tests' *_perf) copied from
#               $CLIENT_BIN when it is set; this script builds none of them.
# Debug info is stripped. Usage: scripts/gpu_bundle.sh BUILD_DIR PREFIX
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
prefix=$2
cuda=${CUDA_HOME:-/usr/local/cuda}
rm -rf "$prefix"
mkdir -p "$prefix/lib" "$prefix/bin"
cp -L "$build/libcollie.so.0" "$prefix/lib/libcollie.so.0"
strip --strip-debug "$prefix/lib/libcollie.so.0"
ln -s libcollie.so.0 "$prefix/lib/libnccl.so.2"
for dep in $(ldd "$build/libcollie.so.0" | awk '/=>/ {print $3}'); do
  case $(basename "$dep") in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
    *) cp -L "$dep" "$prefix/lib/" ;;
  esac
done
for t in gpu_test_coll gpu_test_extra gpu_abi_device; do
  if [ -x "$build/tests/gpu/$t" ]; then
    cp "$build/tests/gpu/$t" "$prefix/bin/"
    strip --strip-debug "$prefix/bin/$t"
  fi
done
cc -O2 -o "$prefix/bin/gpu-perf" "$here/bench/gpu_perf.c" -I"$here/include" -I"$cuda/include" \
   "$build/libcollie.so.0" -L"$cuda/lib64" -lcudart
cp -L "$cuda/lib64/libcudart.so.13" "$prefix/lib/" 2>/dev/null || true
cc -O2 -shared -fPIC -o "$prefix/lib/libvdev.so" "$here/tests/gpu/vdev_shim.c" -I"$cuda/include" -ldl
if [ -n "${CLIENT_BIN:-}" ]; then
  mkdir -p "$prefix/nt"
  for b in "$CLIENT_BIN"/*_perf; do
    cp "$b" "$prefix/nt/"
    strip "$prefix/nt/$(basename "$b")"
  done
fi
du -sh "$prefix"
