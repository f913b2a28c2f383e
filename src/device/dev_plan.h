/* Pure logic of the device path, kept free of CUDA so that host unit tests
 * (tests/gpu/test_plan.c) cover it: which user buffers a call reads and writes
 * at this rank, whether a call mixes host and device memory, how a group of
 * calls is laid out in the staging buffer, and the registration cache behind
 * ncclCommRegister. dev_exec.c (CUDA) and enqueue.c use it. */
#ifndef COLLIE_DEVICE_DEV_PLAN_H
#define COLLIE_DEVICE_DEV_PLAN_H

#include <stddef.h>
#include <stdint.h>

/* Memory classes of the buffers one call uses (bits). */
enum { MEM_HOST = 1, MEM_DEVICE = 2,
       /* A send whose device buffer the NIC reads itself (GPUDirect RDMA):
        * not staged; the host code hands the device pointer to the
        * transport's send_commit_dev and never touches it. */
       MEM_GDR = 4 };

/* What a call does with its buffers at one rank. `kind` is coll.h's
 * coll_kind; count is the API's count, esz the element size. */
struct dev_roles {
  size_t send_bytes; /* bytes of sendbuff read (0: not read) */
  size_t recv_bytes; /* bytes of recvbuff written (0: not written) */
};
void dev_roles(int kind, int rank, int nranks, int root, size_t count, size_t esz, struct dev_roles* r);

/* Mixing check over the classes (device_mem_class) of the buffers a call
 * uses: 1 if host and device are mixed. */
static inline int dev_mem_mixed(int mem) { return mem == (MEM_HOST | MEM_DEVICE); }

/* Staging layout of one call: sendbuff and recvbuff map into one staging
 * region when their device ranges overlap (in-place calls keep their
 * aliasing), into two regions otherwise. Offsets are from the start of the
 * group's staging buffer; regions start on 64-byte boundaries. */
struct dev_stage {
  uintptr_t send_lo, send_hi; /* device range read (empty: lo == hi) */
  uintptr_t recv_lo, recv_hi; /* device range written */
  size_t send_off, recv_off;  /* staging offset of send_lo / recv_lo */
  int shared;                 /* one region holds both */
};
/* Plans one call at staging offset *off (advanced past what it uses).
 * Returns the staging offset to map an address `p` of the call into with
 * dev_stage_map. Ranges of zero bytes use no staging. */
void dev_stage_plan(struct dev_stage* s, const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                    size_t* off);
/* Host address standing for device address p (inside a planned range) given
 * the staging base; NULL when p is not in a planned range. */
void* dev_stage_map(const struct dev_stage* s, char* base, const void* p);

/* ---- registration cache (ncclCommRegister) ---- */
struct dev_reg {
  uintptr_t lo, hi;
  int refs;
  uint32_t id;
};
struct dev_regcache {
  struct dev_reg* r;
  int n, cap;
  uint32_t next_id;
};
/* Registers [p, p+bytes); the same range again takes another reference.
 * Returns the handle (never 0) or 0 on allocation failure. */
uint32_t dev_reg_add(struct dev_regcache* c, const void* p, size_t bytes);
/* Drops one reference; 0 on success, -1 for an unknown handle. */
int dev_reg_remove(struct dev_regcache* c, uint32_t handle);
/* 1 when [p, p+bytes) lies inside one registered range. */
int dev_reg_covers(const struct dev_regcache* c, const void* p, size_t bytes);
/* The same, and that range in [*lo, *hi). */
int dev_reg_find(const struct dev_regcache* c, const void* p, size_t bytes, uintptr_t* lo, uintptr_t* hi);
void dev_reg_free(struct dev_regcache* c);

#endif
