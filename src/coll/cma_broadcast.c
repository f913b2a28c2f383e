/* Single-copy broadcast on one host: every other rank reads the root's
 * buffer straight from its memory (cross-memory attach, through the p2p
 * batch's single-copy messages), all at once; one copy per byte received
 * instead of the ring's two per hop. Eligible when the communicator's probe
 * found cross-memory attach working (transport/cma.c). */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

/* Smallest size for the row once the tuner may use single copy on its own
 * (COLLIE_CMA=auto uses it for none yet: transport/cma.c); COLLIE_CMA=1
 * allows every size. */
#define CMA_BCAST_MIN_BYTES ((size_t)256 << 10)

static int eligible(const struct coll_args* a) { return coll_cma_eligible(a, CMA_BCAST_MIN_BYTES, 0); }

/* n-1 readers share the root's memory bandwidth over the host's CPUs; each
 * reads once (half the FIFO's copies). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double cpus = COLLIE_MAX(1.0, comm->cpus_per_rank * n);
  double par = COLLIE_MIN((double)(n - 1), cpus);
  return tune_cma_handshake_us(c) + (n - 1) * bytes / c->cma_bw / par;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  struct p2p_op* ops = calloc((size_t)n, sizeof(*ops));
  if (!ops) return err_set(ncclSystemError, "out of memory in a single-copy broadcast");
  int k = 0;
  uint64_t tok = coll_token(a, bytes);
  if (r == a->root) {
    for (int i = 1; i < n; i++)
      ops[k++] = (struct p2p_op){.peer = (r + i) % n, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes,
                                 .token = tok};
    if (a->recvbuff != a->sendbuff) memcpy(a->recvbuff, a->sendbuff, bytes);
  } else {
    ops[k++] = (struct p2p_op){.peer = a->root, .is_send = 0, .buf = a->recvbuff, .bytes = bytes, .token = tok};
  }
  ncclResult_t res = p2p_run(comm, ops, k, 0);
  free(ops);
  return res;
}

const struct algo algo_cma_broadcast = {COLL_BROADCAST, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
