/* Single-copy gather on one host, pushed: every non-root writes its block
 * straight into the root's receive buffer (cross-memory attach,
 * process_vm_writev) while the root copies its own block. Pulled (the
 * point-to-point batch's single-copy messages, as the other rows read),
 * the root alone made every copy, its peers only waited: 2 ranks, 128-256
 * MiB, 0.89-0.91x Open MPI's time, whose root does the same; 4 ranks on 2
 * CPUs, 512 KiB-256 MiB, 0.85-0.99x (docs/BENCHMARKS.md). Pushed, the
 * copies run on every rank that has a CPU.
 *
 * Per call, two exchanges through the one-shot mailboxes: the root posts
 * where its receive buffer is (direct_shm_post) and each non-root reads it
 * (direct_shm_fetch), writes its block and posts whether the write worked;
 * the root collects those posts (direct_shm_collect) and returns, its buffer
 * complete. A non-root goes on as soon as it has posted: nothing of its own
 * is read later. Eligible when the communicator's probe found cross-memory
 * attach working (transport/cma.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"

struct gather_post {
  uint64_t addr; /* the root: its receive buffer */
  int32_t pid;
  int32_t ok;  /* a non-root: its write worked */
  int32_t err; /* errno of a failed write */
};
/* Inline in the mailbox's line (INLINE_BYTES in direct_shm.c). */
_Static_assert(sizeof(struct gather_post) <= 40, "one mailbox line");

/* Under COLLIE_CMA=auto the row is weighed from the point-to-point
 * threshold on (graph/tuning.c); COLLIE_CMA=1 allows every size. */
static int eligible(const struct coll_args* a) { return coll_cma_eligible(a); }

/* Two exchanges; the n-1 writes and the root's own copy run in rounds of
 * one a CPU, each a system call and a block at the single-copy rate. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double cpus = COLLIE_MAX(1.0, comm->cpus_per_rank * n);
  double rounds = ceil(n / COLLIE_MIN((double)n, cpus));
  return 2.0 * c->link.alpha_us +
         rounds * (c->cma_call_us + bytes / (tune_cma_bw(c, 2.0 * bytes) * comm->oversub));
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, me = comm->rank, root = a->root;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  /* Both exchanges check that every rank is in this same call (the one-shot
   * mailboxes compare each post's call token with their own). */
  if (me != root) {
    struct gather_post rp, mine = {0, (int32_t)getpid(), 1, 0};
    NCCLCHECK(direct_shm_fetch(comm, root, &rp, sizeof(rp)));
    ncclResult_t res = ncclSuccess;
    if (cma_write(rp.pid, rp.addr + (uint64_t)me * bytes, a->sendbuff, bytes, &mine.err) != ncclSuccess) {
      mine.ok = 0;
      res = err_set(ncclSystemError, "rank %d: single-copy gather: could not write to rank %d's buffer (%s)", me, root,
                    strerror(mine.err));
    }
    NCCLCHECK(direct_shm_post(comm, &mine, sizeof(mine)));
    return res == ncclSuccess ? ncclSuccess : prim_fail(comm, res);
  }
  struct gather_post mine = {(uint64_t)(uintptr_t)a->recvbuff, (int32_t)getpid(), 1, 0};
  NCCLCHECK(direct_shm_post(comm, &mine, sizeof(mine)));
  char* own = (char*)a->recvbuff + (size_t)me * bytes;
  if (own != a->sendbuff) prim_copy_out(own, a->sendbuff, bytes, a->out_far);
  struct gather_post stack[16];
  struct gather_post* all = n <= 16 ? stack : malloc(sizeof(*all) * (size_t)n);
  if (!all) return err_set(ncclSystemError, "out of memory in a single-copy gather");
  ncclResult_t res = direct_shm_collect(comm, all, sizeof(*all));
  for (int i = 0; i < n && res == ncclSuccess; i++) {
    if (i != me && !all[i].ok)
      res = err_set(ncclSystemError, "rank %d: single-copy gather: rank %d could not write to this rank's buffer (%s)",
                    me, i, strerror(all[i].err));
  }
  if (all != stack) free(all);
  return res == ncclSuccess ? ncclSuccess : prim_fail(comm, res);
}

const struct algo algo_cma_gather = {COLL_GATHER, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
