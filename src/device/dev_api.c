/* Memory and registration entry points of the device path: ncclMemAlloc /
 * ncclMemFree (cudaMalloc on the calling thread's device; host memory that
 * the ranks of a host can map where there is no CUDA device or
 * COLLIE_MEMALLOC=host asks for it, hostmem.h) and
 * ncclCommRegister / ncclCommDeregister, a per-communicator cache of
 * registered ranges. The staged device path copies every call through host
 * staging, so for device memory registration records the range and changes
 * no data path (programs that register, as NCCL recommends, run unchanged).
 * Host memory registered here is what the IB transport keeps registered with
 * the HCA across operations (net_ib.c): the caller promises it stays mapped
 * until ncclCommDeregister, which bumps comm->reg_gen so that connectors
 * drop such registrations before their next operation. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../comm.h"
#include "../hostmem.h"
#include "device.h"
#include "device/dev_plan.h"

struct dev_regs {
  pthread_mutex_t mu;
  struct dev_regcache c;
};
static pthread_mutex_t regs_mu = PTHREAD_MUTEX_INITIALIZER;

NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == NULL) return err_set(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (size == 0) return err_set(ncclInvalidArgument, "ncclMemAlloc: size is 0");
  int host = hostmem_wanted();
  if (host < 0) return ncclInvalidArgument;
  return host ? hostmem_alloc(ptr, size) : device_mem_alloc(ptr, size);
}

NCCL_API(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == NULL) return ncclSuccess;
  if (hostmem_free(ptr)) return ncclSuccess;
  if (device_count() == 0)
    return err_set(ncclInvalidArgument, "ncclMemFree: %p was not returned by ncclMemAlloc (host memory: no CUDA device)",
                   ptr);
  return device_mem_free(ptr);
}

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  NCCLCHECK(comm_check(comm, "ncclCommRegister"));
  if (handle == NULL) return err_set(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  *handle = NULL;
  if (buff == NULL || size == 0)
    return err_set(ncclInvalidArgument, "ncclCommRegister: buff %p / size %zu: need a non-empty buffer", buff, size);
  pthread_mutex_lock(&regs_mu);
  if (!comm->dev_regs) {
    struct dev_regs* r = calloc(1, sizeof(*r));
    if (r) pthread_mutex_init(&r->mu, NULL);
    __atomic_store_n(&comm->dev_regs, r, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&regs_mu);
  struct dev_regs* r = comm->dev_regs;
  if (!r) return err_set(ncclSystemError, "ncclCommRegister: out of memory");
  pthread_mutex_lock(&r->mu);
  uint32_t id = dev_reg_add(&r->c, buff, size);
  pthread_mutex_unlock(&r->mu);
  if (id == 0) return err_set(ncclSystemError, "ncclCommRegister: out of memory");
  INFO(LOG_REG, "comm %p rank %d: registered %p + %zu (handle %u)", (void*)comm, comm->rank, buff, size, id);
  *handle = (void*)(uintptr_t)id;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  NCCLCHECK(comm_check(comm, "ncclCommDeregister"));
  struct dev_regs* r = comm->dev_regs;
  int rc = -1;
  if (r && handle) {
    pthread_mutex_lock(&r->mu);
    rc = dev_reg_remove(&r->c, (uint32_t)(uintptr_t)handle);
    pthread_mutex_unlock(&r->mu);
  }
  if (rc != 0)
    return err_set(ncclInvalidArgument, "ncclCommDeregister: handle %p was not returned by ncclCommRegister on this comm",
                   handle);
  __atomic_add_fetch(&comm->reg_gen, 1, __ATOMIC_RELEASE);
  return ncclSuccess;
}

int comm_reg_lookup(struct ncclComm* comm, const void* p, size_t bytes, uintptr_t* lo, uintptr_t* hi) {
  struct dev_regs* r = __atomic_load_n(&comm->dev_regs, __ATOMIC_ACQUIRE);
  if (!r) return 0;
  pthread_mutex_lock(&r->mu);
  int found = dev_reg_find(&r->c, p, bytes, lo, hi);
  pthread_mutex_unlock(&r->mu);
  return found;
}

void dev_comm_free(struct ncclComm* comm) {
  dev_exec_free(comm);
  struct dev_regs* r = comm->dev_regs;
  if (r) {
    dev_reg_free(&r->c);
    pthread_mutex_destroy(&r->mu);
    free(r);
    comm->dev_regs = NULL;
  }
}

static device_dmabuf_exporter dmabuf_exporter; /* tests only; NULL: the driver's */

void device_dmabuf_set_exporter(device_dmabuf_exporter fn) { __atomic_store_n(&dmabuf_exporter, fn, __ATOMIC_RELEASE); }

int device_dmabuf_export(const void* p, size_t bytes, struct device_dmabuf* out, char* why, size_t why_len) {
  if (why_len) why[0] = '\0';
  if (out) out->fd = -1;
  device_dmabuf_exporter fn = __atomic_load_n(&dmabuf_exporter, __ATOMIC_ACQUIRE);
  int rc = fn ? fn(p, bytes, out, why, why_len) : device_dmabuf_export_driver(p, bytes, out, why, why_len);
  if (rc == 0 && out && ((uintptr_t)p < out->base || bytes > out->size || (uintptr_t)p - out->base > out->size - bytes)) {
    /* An exporter that does not cover what was asked is a bug: refuse. */
    if (out->fd >= 0) close(out->fd);
    out->fd = -1;
    if (why_len) snprintf(why, why_len, "the exported range %#lx + %zu does not hold %p + %zu", (unsigned long)out->base,
                          out->size, p, bytes);
    errno = EINVAL;
    return -1;
  }
  return rc;
}
