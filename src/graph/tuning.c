/* Cost model: latency + bytes / bandwidth per algorithm step and transport,
 * used by ncclGroupSimulateEnd (and, as algorithms multiply, to choose among
 * them). The constants are this machine's rough figures (docs/BENCHMARKS.md);
 * they are estimates, not promises. */
#include "../coll/coll.h"

struct link_cost {
  double alpha_us; /* per step */
  double gbps;     /* payload GB/s per link */
};

static struct link_cost cost_for(const struct ncclComm* comm) {
  /* Ranks on different hosts (or NCCL_SHM_DISABLE) use sockets. */
  int shm = comm->nhosts == 1 && !param_int(P_NCCL_SHM_DISABLE, 0, 1);
  struct link_cost c = {shm ? 1.0 : 15.0, shm ? 5.0 : 1.0};
  return c;
}

double coll_estimate_us(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  struct link_cost c = cost_for(comm);
  double steps, moved;
  switch (a->kind) {
    case COLL_ALLREDUCE: steps = 2.0 * (n - 1); moved = 2.0 * (n - 1) / n * bytes; break;
    case COLL_ALLGATHER: steps = n - 1; moved = (n - 1) * bytes; break;
    case COLL_REDUCESCATTER: steps = n - 1; moved = (n - 1) * bytes; break;
    case COLL_BROADCAST:
    case COLL_REDUCE: steps = n - 1; moved = bytes; break;
    case COLL_ALLTOALL:
    case COLL_GATHER:
    case COLL_SCATTER: steps = 1; moved = (n - 1) * bytes; break;
    default: steps = 1; moved = bytes; break;
  }
  if (n == 1) return bytes / (c.gbps * 4e3);
  return steps * c.alpha_us + moved / (c.gbps * 1e3);
}
