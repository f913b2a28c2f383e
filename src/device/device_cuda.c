/* CUDA runtime probe for device.h. The runtime is linked statically, so the
 * library loads on machines without a driver: calls then fail and the device
 * path is reported off once. */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "../core.h"
#include "device.h"
#include "device/dev_plan.h"

static int cached_count = -1;

int device_count(void) {
  int n = __atomic_load_n(&cached_count, __ATOMIC_ACQUIRE);
  if (n >= 0) return n;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    INFO_ONCE(LOG_INIT, "CUDA device path off: %s (host buffers only)", cudaGetErrorString(e));
    cudaGetLastError();
    count = 0;
  } else if (count == 0) {
    INFO_ONCE(LOG_INIT, "CUDA device path off: no CUDA device (host buffers only)");
  }
  __atomic_store_n(&cached_count, count, __ATOMIC_RELEASE);
  return count;
}

int device_current(void) {
  if (device_count() == 0) return -1;
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) return -1;
  return dev;
}

int device_set(int dev) {
  if (device_count() == 0) return -1;
  return cudaSetDevice(dev) == cudaSuccess ? 0 : -1;
}

void device_pci_bus_id(int dev, char* buf, size_t len) {
  if (len) buf[0] = '\0';
  if (dev < 0 || device_count() == 0) return;
  if (cudaDeviceGetPCIBusId(buf, (int)len, dev) != cudaSuccess && len) buf[0] = '\0';
}

const char* device_runtime(void) {
  static char s[64];
  int v = 0;
  cudaRuntimeGetVersion(&v);
  snprintf(s, sizeof(s), "CUDA runtime %d.%d", v / 1000, (v % 1000) / 10);
  return s;
}

int device_mem_class(const void* p) {
  if (p == NULL || device_count() == 0) return MEM_HOST;
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return MEM_HOST;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? MEM_DEVICE : MEM_HOST;
}

ncclResult_t device_mem_alloc(void** p, size_t bytes) {
  if (device_count() == 0) return err_set(ncclInvalidUsage, "ncclMemAlloc: no CUDA device (the device path is off)");
  cudaError_t e = cudaMalloc(p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *p = NULL;
    return err_set(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc of %zu bytes failed: %s", bytes,
                   cudaGetErrorString(e));
  }
  return ncclSuccess;
}

ncclResult_t device_mem_free(void* p) {
  if (device_count() == 0) return err_set(ncclInvalidUsage, "ncclMemFree: no CUDA device (the device path is off)");
  cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return err_set(ncclUnhandledCudaError, "ncclMemFree: cudaFree(%p) failed: %s", p, cudaGetErrorString(e));
  }
  return ncclSuccess;
}
