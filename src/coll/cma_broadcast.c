/* Single-copy broadcast on one host: every other rank reads the root's
 * buffer straight from its memory (cross-memory attach, through the p2p
 * batch's single-copy messages), all at once; one copy per byte received
 * instead of the ring's two per hop. Eligible when the communicator's probe
 * found cross-memory attach working (transport/cma.c). */
#include <math.h>
#include <stdlib.h>

#include "coll.h"

/* Under COLLIE_CMA=auto the row is weighed from the point-to-point
 * threshold on (graph/tuning.c); COLLIE_CMA=1 allows every size. */
static int eligible(const struct coll_args* a) { return coll_cma_eligible(a); }

/* The n-1 readers each read the root's block once (half the FIFO's copies),
 * at its core's private-cache rate while the root's block and its own copy
 * fit there. The root only waits, so the readers have the host's CPUs to
 * themselves: the table's rates are a CPU's share when every rank copies
 * (graph/tuning.c divides them by the ranks per CPU), a reader that has a
 * CPU copies at the whole rate. One system call moves a reader's whole
 * block, so with more readers than CPUs they run in rounds, each a handshake
 * and a whole block (4 ranks on 2 CPUs, 2-32 MiB: two blocks' time; 8 ranks:
 * four), and the root returns once its last reader has released its buffer
 * (8 ranks on 2 CPUs, 32 KiB: 35 us against the ring's 12). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double cpus = COLLIE_MAX(1.0, comm->cpus_per_rank * n);
  double rounds = ceil((n - 1) / COLLIE_MIN((double)(n - 1), cpus));
  return rounds * (tune_cma_handshake_us(c) + bytes / (tune_cma_bw(c, 2.0 * bytes) * comm->oversub));
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  struct p2p_op* ops = calloc((size_t)n + 1, sizeof(*ops));
  if (!ops) return err_set(ncclSystemError, "out of memory in a single-copy broadcast");
  int k = 0;
  uint64_t tok = coll_token(a, bytes);
  if (r == a->root) {
    for (int i = 1; i < n; i++)
      ops[k++] = (struct p2p_op){.peer = (r + i) % n, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes,
                                 .token = tok};
    /* Out of place, the root's own copy is a message to itself: the batch
     * makes it while the readers read, not before they can start. */
    if (a->recvbuff != a->sendbuff) {
      ops[k++] = (struct p2p_op){.peer = r, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes, .token = tok};
      ops[k++] = (struct p2p_op){.peer = r, .is_send = 0, .buf = a->recvbuff, .bytes = bytes, .token = tok};
    }
  } else {
    ops[k++] = (struct p2p_op){.peer = a->root, .is_send = 0, .buf = a->recvbuff, .bytes = bytes, .token = tok};
  }
  ncclResult_t res = p2p_run(comm, ops, k, 0);
  free(ops);
  return res;
}

const struct algo algo_cma_broadcast = {COLL_BROADCAST, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
