/* The small C interface between the library and the CUDA runtime. Only files
 * under src/device/ include CUDA headers; without a toolkit (or with
 * COLLIE_CUDA=OFF) device_stub.c provides the same functions. */
#ifndef COLLIE_DEVICE_H
#define COLLIE_DEVICE_H

#include <stddef.h>

/* Number of usable CUDA devices; 0 when the toolkit, driver or GPU is absent
 * (one INFO line says why, once per process). */
int device_count(void);
/* The calling thread's current device, or -1. */
int device_current(void);
/* Makes `dev` current for the calling thread; 0 on success. */
int device_set(int dev);
/* PCI bus id of `dev` into buf ("" on failure). */
void device_pci_bus_id(int dev, char* buf, size_t len);
/* 1 if p is device memory (never when there is no device). */
int device_is_device_ptr(const void* p);
/* "CUDA runtime 13.0" or "none" (for logs). */
const char* device_runtime(void);

#endif
