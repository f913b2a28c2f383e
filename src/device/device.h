/* The small C interface between the library and the CUDA runtime. Only files
 * under src/device/ include CUDA headers; without a toolkit (or with
 * COLLIE_CUDA=OFF) device_stub.c provides the same functions. */
#ifndef COLLIE_DEVICE_H
#define COLLIE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Number of usable CUDA devices; 0 when the toolkit, driver or GPU is absent
 * (one INFO line says why, once per process). */
int device_count(void);
/* The calling thread's current device, or -1. */
int device_current(void);
/* Makes `dev` current for the calling thread; 0 on success. */
int device_set(int dev);
/* PCI bus id of `dev` into buf ("" on failure). */
void device_pci_bus_id(int dev, char* buf, size_t len);
/* "CUDA runtime 13.0" or "none" (for logs). */
const char* device_runtime(void);
/* dev_plan.h's MEM_DEVICE for device or managed memory (stream-ordered, as
 * NCCL treats it), MEM_HOST for anything else (plain, pinned, unknown). */
int device_mem_class(const void* p);
/* Copies n bytes of device memory to the host (synchronous); 0, or -1 with
 * err_set called (no device, or the copy failed). For small values the host
 * must read, such as a device-resident PreMulSum scalar of a host call. */
int device_read(void* dst, const void* src, size_t n);
/* ncclMemAlloc / ncclMemFree on the calling thread's device. */
ncclResult_t device_mem_alloc(void** p, size_t bytes);
ncclResult_t device_mem_free(void* p);

/* ---- GPUDirect RDMA: device memory a NIC reads through a dma-buf ----
 * A device allocation exported as a dma-buf: fd covers the device addresses
 * [base, base + size) (the whole allocation holding the pointer, page
 * aligned), offset 0 of the dma-buf being `base`. The caller closes fd once it
 * has registered it (the registration holds its own reference). */
struct device_dmabuf {
  int fd;
  uintptr_t base;
  size_t size;
};
/* Exports the device allocation holding [p, p + bytes): 0 and *out, or -1
 * with errno set and a reason in why (ENODEV: no device or not device memory,
 * ENOSYS: the driver has no dma-buf export, EOPNOTSUPP: the device or the
 * memory (managed, host) cannot be exported). With out NULL it only checks
 * that it could (no fd is made). dev_api.c: calls the exporter set with
 * device_dmabuf_set_exporter, else the CUDA driver's; exporters take the
 * same NULL. */
int device_dmabuf_export(const void* p, size_t bytes, struct device_dmabuf* out, char* why, size_t why_len);
/* The CUDA driver's exporter (cuMemGetHandleForAddressRange; device_cuda.c,
 * or device_stub.c without CUDA: always -1). */
int device_dmabuf_export_driver(const void* p, size_t bytes, struct device_dmabuf* out, char* why, size_t why_len);
/* Tests: replaces the exporter for the whole process (NULL: the driver's), so
 * that the GPUDirect path runs on machines without a GPU over memory that
 * stands for device memory. */
typedef int (*device_dmabuf_exporter)(const void* p, size_t bytes, struct device_dmabuf* out, char* why,
                                      size_t why_len);
void device_dmabuf_set_exporter(device_dmabuf_exporter fn);

/* ---- the device executor (dev_exec.c with CUDA, device_stub.c without) ----
 * Calls with device buffers are enqueued on their streams and run by a
 * per-communicator proxy thread (or, at one rank, by kernels straight on the
 * stream); see docs/ARCHITECTURE.md, "Device path". */
struct ncclComm;
struct coll_args;
/* Enqueues n calls of one communicator (a group, or one call); returns once
 * they are enqueued, or, with `host_wait`, once they have run. */
ncclResult_t dev_submit(struct ncclComm* comm, const struct coll_args* a, int n, int host_wait);
/* Waits until every call enqueued on comm has run (host buffers after device
 * ones keep the order all ranks see). */
ncclResult_t dev_quiesce(struct ncclComm* comm);
/* Stops the proxy thread (after the queued calls) and frees the device state. */
void dev_exec_free(struct ncclComm* comm);
/* Both halves: executor and registration cache (dev_api.c). */
void dev_comm_free(struct ncclComm* comm);
/* Runs calls on host memory on the calling thread, as a group (enqueue.c);
 * the proxy thread uses it on staged buffers. */
ncclResult_t enqueue_run_host(struct coll_args* a, int n);

#endif
