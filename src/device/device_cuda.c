/* CUDA runtime probe for device.h. The runtime is linked statically, so the
 * library loads on machines without a driver: calls then fail and the device
 * path is reported off once. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

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

int device_read(void* dst, const void* src, size_t n) {
  cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    cudaGetLastError();
    err_set(ncclUnhandledCudaError, "reading %zu bytes of device memory at %p failed: %s", n, src,
            cudaGetErrorString(e));
    return -1;
  }
  return 0;
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

/* ---- dma-buf export (GPUDirect RDMA) through the driver API. The runtime
 * hands out driver entry points, so libcuda is never linked. Written against
 * CUDA 12/13's documented API; never run on a GPU here (see docs/IB.md). */
typedef CUresult (*pfn_get_address_range)(CUdeviceptr* base, size_t* size, CUdeviceptr p);
typedef CUresult (*pfn_get_handle)(void* handle, CUdeviceptr p, size_t size, CUmemRangeHandleType type,
                                   unsigned long long flags);
typedef CUresult (*pfn_device_attr)(int* v, CUdevice_attribute a, CUdevice dev);
static struct {
  pthread_once_t once;
  pfn_get_address_range range;
  pfn_get_handle handle;
  pfn_device_attr attr;
} drv = {PTHREAD_ONCE_INIT, NULL, NULL, NULL};

static void* driver_entry(const char* name) {
  void* fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return fn;
}

static void driver_resolve(void) {
  drv.range = (pfn_get_address_range)driver_entry("cuMemGetAddressRange");
  drv.handle = (pfn_get_handle)driver_entry("cuMemGetHandleForAddressRange");
  drv.attr = (pfn_device_attr)driver_entry("cuDeviceGetAttribute");
}

int device_dmabuf_export_driver(const void* p, size_t bytes, struct device_dmabuf* out, char* why, size_t why_len) {
  if (out) out->fd = -1;
  if (device_count() == 0) {
    snprintf(why, why_len, "no CUDA device");
    errno = ENODEV;
    return -1;
  }
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    snprintf(why, why_len, "%p is not device memory (managed and host memory are not exported)", p);
    errno = EOPNOTSUPP;
    return -1;
  }
  pthread_once(&drv.once, driver_resolve);
  if (!drv.range || !drv.handle || !drv.attr) {
    snprintf(why, why_len, "the CUDA driver has no cuMemGetHandleForAddressRange (dma-buf export needs CUDA 11.7+)");
    errno = ENOSYS;
    return -1;
  }
  int ok = 0;
  if (drv.attr(&ok, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, (CUdevice)attr.device) != CUDA_SUCCESS || !ok) {
    snprintf(why, why_len, "GPU %d does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; needs an "
             "open kernel module driver and Linux 5.12+)", attr.device);
    errno = EOPNOTSUPP;
    return -1;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = drv.range(&base, &size, (CUdeviceptr)(uintptr_t)p);
  if (r != CUDA_SUCCESS || (uintptr_t)p + bytes > (uintptr_t)base + size) {
    snprintf(why, why_len, "cuMemGetAddressRange(%p) failed (%d) or the allocation ends before %p + %zu", p, (int)r,
             p, bytes);
    errno = EINVAL;
    return -1;
  }
  /* The range handed to the driver must be page aligned; device allocations
   * are made in larger granules, so rounding stays inside the allocation. */
  if (!out) return 0; /* a check only */
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = (uintptr_t)base & ~(pg - 1), hi = ((uintptr_t)base + size + pg - 1) & ~(pg - 1);
  int fd = -1;
  r = drv.handle(&fd, (CUdeviceptr)lo, hi - lo, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS || fd < 0) {
    snprintf(why, why_len, "cuMemGetHandleForAddressRange(%#lx + %zu, DMA_BUF_FD) failed (%d)", (unsigned long)lo,
             (size_t)(hi - lo), (int)r);
    errno = EOPNOTSUPP;
    return -1;
  }
  out->fd = fd;
  out->base = lo;
  out->size = hi - lo;
  return 0;
}
