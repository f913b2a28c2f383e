/* Hierarchical allreduce for communicators that span hosts: reduce within
 * each host to its leader over shared memory, allreduce among the leaders
 * over the network ring, then broadcast within each host. The network sees
 * one rank per host and 2(hosts-1) steps instead of 2(n-1). Leaders and
 * host rings come from the locality order (graph/rings.c). */
#include "coll.h"

static ncclResult_t hier_allreduce(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  if (a->count == 0) return ncclSuccess;
  struct ring_view local = ring_local(comm), leaders = ring_leaders(comm);
  /* Partial sums are already scaled: the leaders combine them with a plain sum. */
  struct red_op partial = a->op;
  if (partial.kind == RED_PREMULSUM) partial.kind = RED_SUM;
  NCCLCHECK(ring_reduce_view(a, &local, 0, a->sendbuff, a->recvbuff, 0));
  if (leaders.pos >= 0) NCCLCHECK(ring_allreduce_view(a, &leaders, a->recvbuff, a->recvbuff, &partial, 0));
  NCCLCHECK(ring_broadcast_view(a, &local, 0, a->recvbuff, a->recvbuff));
  if (a->avg) red_div(a->dt, a->recvbuff, a->recvbuff, a->count, comm->nranks);
  return ncclSuccess;
}

/* Only across hosts, with several ranks on some host. */
static int eligible(const struct coll_args* a) {
  return a->comm->nhosts > 1 && a->comm->nleaders < a->comm->nranks;
}

/* Shared-memory reduce and broadcast chains plus a ring of leaders. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  const struct ncclComm* comm = a->comm;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  int h = comm->nleaders, l = comm->nranks / h;
  return 2.0 * (l - 1) * c->local.alpha_us + 2.0 * bytes / c->local.bw + 2.0 * (h - 1) * c->link.alpha_us +
         2.0 * (h - 1) / h * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  return hier_allreduce(a);
}

const struct algo algo_hier_allreduce = {COLL_ALLREDUCE, ALGO_HIER, PROTO_SIMPLE, 0, eligible, estimate, run};
