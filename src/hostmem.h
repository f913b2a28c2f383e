/* Host memory that the ranks of one host can map: what ncclMemAlloc returns
 * when it hands out host memory (no CUDA device, or COLLIE_MEMALLOC=host).
 * Each allocation is its own memfd (transport/shmseg.h: 0600, opened by
 * peers of the same user through /proc/<pid>/fd, nothing in /dev/shm),
 * mapped shared, and kept in a process-wide list so that a collective can
 * tell whether a buffer lies in one and where (coll/mapped_allreduce.c:
 * peers then read and write it in place, no copy through a FIFO). */
#ifndef COLLIE_HOSTMEM_H
#define COLLIE_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Where a range lies: the allocation's memfd (this process's fd number),
 * its inode (what a peer checks it opened), the allocation's length and the
 * range's offset in it. */
struct hostmem_ref {
  int32_t fd;
  uint64_t ino;
  uint64_t len;
  uint64_t off;
};

/* Whether ncclMemAlloc hands out host memory here: 1 with COLLIE_MEMALLOC=host
 * or auto (default) without a CUDA device, 0 for device memory, -1 (and the
 * error set) for a value that is none of auto, host, device. */
int hostmem_wanted(void);
/* A zeroed, page-aligned shared allocation of `size` bytes (> 0). */
ncclResult_t hostmem_alloc(void** p, size_t size);
/* Frees an allocation made by hostmem_alloc: 1 if `p` was the start of one
 * (now freed), 0 if not (nothing happens). Its pages go back at once, also
 * those a peer still maps (the memfd is truncated): a peer only ever touches
 * an allocation while the owner is inside a collective that uses it. */
int hostmem_free(void* p);
/* 1 and *out filled if [p, p + bytes) lies within one allocation (bytes 0:
 * p itself does), else 0. Safe from any thread. */
int hostmem_find(const void* p, size_t bytes, struct hostmem_ref* out);
/* Allocations alive in this process (for tests and logs). */
int hostmem_count(void);

#endif
