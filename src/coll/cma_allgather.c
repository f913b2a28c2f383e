/* Single-copy allgather on one host: every rank reads each peer's block
 * straight from the peer's send buffer (cross-memory attach, through the p2p
 * batch's single-copy messages): one copy per byte received instead of the
 * ring's two per hop. Eligible when the communicator's probe found
 * cross-memory attach working (transport/cma.c). */
#include <stdlib.h>

#include "coll.h"

/* Under COLLIE_CMA=auto the row is weighed from the point-to-point
 * threshold (per rank) on (graph/tuning.c); COLLIE_CMA=1 allows every size. */
static int eligible(const struct coll_args* a) { return coll_cma_eligible(a); }

/* Every rank reads n-1 blocks once, at its core's private-cache rate while
 * its send and receive buffers fit there. All n ranks copy at once, so each
 * gets its share of a CPU: the table's rates already say so (graph/tuning.c
 * divides them by the ranks per CPU). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  /* The n-1 reads, and the rank's own block copied into its place (counted
   * in place too, as the ring's and the one-shot's models count it). */
  return tune_cma_handshake_us(c) + (n - 1) * bytes / tune_cma_bw(c, (n + 1) * bytes) + bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  struct p2p_op* ops = calloc((size_t)(2 * n), sizeof(*ops));
  if (!ops) return err_set(ncclSystemError, "out of memory in a single-copy allgather");
  int k = 0;
  uint64_t tok = coll_token(a, bytes);
  /* Start with the next rank and go around, so ranks do not all read the same peer first. */
  for (int i = 1; i < n; i++) {
    int to = (r + i) % n, from = (r - i + n) % n;
    ops[k++] = (struct p2p_op){.peer = to, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes, .token = tok,
                               .single_copy = 1};
    ops[k++] = (struct p2p_op){.peer = from, .is_send = 0, .buf = (char*)a->recvbuff + (size_t)from * bytes,
                               .bytes = bytes, .token = tok, .single_copy = 1};
  }
  /* This rank's own block as a message to itself: the batch copies it when
   * the peers' messages first stop moving (waiting for a descriptor or a
   * release), not before it has posted its own descriptor and read what is
   * there. Copying it first, as before: 2 ranks, 32 MiB 4751 against 4174
   * us, 8 MiB 707 against 692, Open MPI 4739 and 692 (`TRANSPORT=shm NP=2
   * bench/ab_env.sh all_gather`, 5 rounds); smaller sizes even. */
  char* mine = (char*)a->recvbuff + (size_t)r * bytes;
  if (mine != a->sendbuff) {
    ops[k++] = (struct p2p_op){.peer = r, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes, .token = tok};
    ops[k++] = (struct p2p_op){.peer = r, .is_send = 0, .buf = mine, .bytes = bytes, .token = tok,
                               .far = a->out_far != 0};
  }
  ncclResult_t res = p2p_run(comm, ops, k, 0);
  free(ops);
  return res;
}

const struct algo algo_cma_allgather = {COLL_ALLGATHER, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
