/* LD_PRELOAD shim for client programs that give each rank its own GPU index
 * (rank i calls cudaSetDevice(i)), so that several ranks can share the GPUs
 * a machine has, as collie allows: the program sees COLLIE_VDEV devices
 * (default: the real count) and device d is real device d % count. Only the
 * program's own calls through the shared CUDA runtime are mapped; collie
 * links its runtime statically and sees the real devices. Used by
 * scripts/gpu_check.sh for multi-rank runs of nccl-tests' thread mode on one GPU.
 * Build: cc -O2 -shared -fPIC -o libvdev.so vdev_shim.c -I$CUDA/include -ldl */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>

static int real_count(void) {
  static int n;
  if (n == 0) {
    cudaError_t (*get)(int*) = (cudaError_t(*)(int*))dlsym(RTLD_NEXT, "cudaGetDeviceCount");
    if (!get || get(&n) != cudaSuccess || n < 1) n = 1;
  }
  return n;
}

cudaError_t cudaGetDeviceCount(int* count) {
  const char* v = getenv("COLLIE_VDEV");
  int n = real_count();
  *count = v && atoi(v) > 0 ? atoi(v) : n;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) {
  cudaError_t (*set)(int) = (cudaError_t(*)(int))dlsym(RTLD_NEXT, "cudaSetDevice");
  return set(dev < 0 ? dev : dev % real_count());
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int dev) {
  cudaError_t (*get)(struct cudaDeviceProp*, int) =
      (cudaError_t(*)(struct cudaDeviceProp*, int))dlsym(RTLD_NEXT, "cudaGetDeviceProperties");
  return get(prop, dev < 0 ? dev : dev % real_count());
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int dev) {
  cudaError_t (*get)(int*, enum cudaDeviceAttr, int) =
      (cudaError_t(*)(int*, enum cudaDeviceAttr, int))dlsym(RTLD_NEXT, "cudaDeviceGetAttribute");
  return get(value, attr, dev < 0 ? dev : dev % real_count());
}
