/* Single-copy alltoall on one host: every rank reads each peer's block for
 * it straight from the peer's send buffer (cross-memory attach, through the
 * p2p batch's single-copy messages), one copy per byte instead of the
 * FIFO's two, and a reader needs only its own CPU time: no slot waits for
 * the writer to be scheduled beside it. Eligible when the communicator's
 * probe found cross-memory attach working (transport/cma.c). */
#include "coll.h"

/* Under COLLIE_CMA=auto the row is eligible from the point-to-point
 * threshold (per message) on (graph/tuning.c), and the measured choice
 * (adapt.c) runs it where it measured faster; COLLIE_CMA=1 allows every size. */
static int eligible(const struct coll_args* a) { return coll_cma_eligible(a); }

/* Every rank reads n-1 blocks; the handshakes of all peers overlap (every
 * descriptor is posted at once). The table's rates already share a CPU
 * among the ranks that run on it (graph/tuning.c). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return tune_cma_handshake_us(c) + (n - 1) * bytes / tune_cma_bw(c, 3.0 * n * bytes);
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  return p2p_alltoall(a, 1);
}

const struct algo algo_cma_alltoall = {COLL_ALLTOALL, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
