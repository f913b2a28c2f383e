/* device.h for builds without the CUDA toolkit (COLLIE_CUDA=OFF or not found):
 * no devices, and one INFO line saying the device path is off. */
#include <errno.h>
#include <stdio.h>

#include "../core.h"
#include "device.h"
#include "device/dev_plan.h"

int device_count(void) {
  INFO_ONCE(LOG_INIT, "CUDA device path off: collie was built without CUDA (host buffers only)");
  return 0;
}
int device_current(void) { return -1; }
int device_set(int dev) {
  (void)dev;
  return -1;
}
void device_pci_bus_id(int dev, char* buf, size_t len) {
  (void)dev;
  if (len) buf[0] = '\0';
}
const char* device_runtime(void) { return "none"; }
int device_mem_class(const void* p) {
  (void)p;
  return MEM_HOST;
}
int device_read(void* dst, const void* src, size_t n) {
  (void)dst;
  (void)src;
  (void)n;
  err_set(ncclInvalidUsage, "device memory cannot be read: collie was built without CUDA");
  return -1;
}
ncclResult_t device_mem_alloc(void** p, size_t bytes) {
  (void)bytes;
  *p = NULL;
  return err_set(ncclInvalidUsage, "ncclMemAlloc: collie was built without CUDA (COLLIE_CUDA=OFF or no toolkit)");
}
ncclResult_t device_mem_free(void* p) {
  (void)p;
  return err_set(ncclInvalidUsage, "ncclMemFree: collie was built without CUDA (COLLIE_CUDA=OFF or no toolkit)");
}
int device_dmabuf_export_driver(const void* p, size_t bytes, struct device_dmabuf* out, char* why, size_t why_len) {
  (void)p;
  (void)bytes;
  if (out) out->fd = -1;
  if (why_len) snprintf(why, why_len, "collie was built without CUDA");
  errno = ENODEV;
  return -1;
}
/* Without CUDA no buffer is ever classed as device memory, so these are not reached. */
ncclResult_t dev_submit(struct ncclComm* comm, const struct coll_args* a, int n, int host_wait) {
  (void)comm;
  (void)a;
  (void)n;
  (void)host_wait;
  return err_set(ncclInvalidUsage, "device buffers: collie was built without CUDA");
}
ncclResult_t dev_quiesce(struct ncclComm* comm) {
  (void)comm;
  return ncclSuccess;
}
void dev_exec_free(struct ncclComm* comm) { (void)comm; }
