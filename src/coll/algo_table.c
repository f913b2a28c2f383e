/* The algorithm table: every algorithm's row (defined in its own file), in
 * the order the tuner breaks ties in, and the names NCCL_ALGO / NCCL_PROTO
 * use. Adding an algorithm: its file, one line here, its test. Read by the
 * tuner (graph/tuning.c) and run by the executor (exec.c). */
#include "coll.h"

const char* const algo_names[ALGO_NNAMES] = {"Ring", "Tree", "Direct", "Hier", "P2P", "CMA", "Mapped", "Doubling"};
const char* const proto_names[PROTO_COUNT] = {"Simple", "LL", "LL128"};

const char* algo_name(int name) { return name >= 0 && name < ALGO_NNAMES ? algo_names[name] : "?"; }

extern const struct algo algo_ring_allreduce, algo_tree_allreduce, algo_hier_allreduce, algo_direct_shm_allreduce,
    algo_direct_net_allreduce, algo_mapped_allreduce, algo_doubling_allreduce,
    algo_doubling_allgather, algo_doubling_reducescatter, algo_doubling_alltoall;
extern const struct algo algo_ring_broadcast, algo_direct_shm_broadcast, algo_direct_net_broadcast;
extern const struct algo algo_ring_reduce, algo_direct_shm_reduce, algo_direct_net_reduce, algo_cma_reduce,
    algo_binomial_reduce;
extern const struct algo algo_ring_allgather, algo_direct_shm_allgather, algo_direct_net_allgather;
extern const struct algo algo_ring_reducescatter, algo_direct_shm_reducescatter, algo_direct_net_reducescatter;
extern const struct algo algo_p2p_alltoall, algo_p2p_gather, algo_p2p_scatter, algo_direct_shm_alltoall;
extern const struct algo algo_direct_shm_gather, algo_direct_shm_scatter, algo_cma_gather;
extern const struct algo algo_cma_broadcast, algo_cma_allgather, algo_cma_alltoall;

/* Per collective, the first row must always be eligible: it is the fallback
 * when nothing the user allows fits a call. */
const struct algo* const algo_table[] = {
    &algo_ring_allreduce,     &algo_tree_allreduce,           &algo_direct_shm_allreduce,
    &algo_direct_net_allreduce, &algo_hier_allreduce,     &algo_mapped_allreduce,   &algo_doubling_allreduce,
    &algo_ring_broadcast,     &algo_direct_shm_broadcast,     &algo_direct_net_broadcast,   &algo_cma_broadcast,
    &algo_ring_reduce,        &algo_direct_shm_reduce,        &algo_direct_net_reduce,      &algo_cma_reduce,
    &algo_binomial_reduce,
    &algo_ring_allgather,     &algo_direct_shm_allgather,     &algo_direct_net_allgather,   &algo_cma_allgather,
    &algo_doubling_allgather,
    &algo_ring_reducescatter, &algo_direct_shm_reducescatter, &algo_direct_net_reducescatter,
    &algo_doubling_reducescatter,
    &algo_p2p_alltoall,       &algo_direct_shm_alltoall,      &algo_cma_alltoall,       &algo_doubling_alltoall,
    &algo_p2p_gather,         &algo_direct_shm_gather,
    &algo_cma_gather,
    &algo_p2p_scatter,        &algo_direct_shm_scatter,
};
const int algo_table_len = (int)(sizeof(algo_table) / sizeof(algo_table[0]));

int algo_always(const struct coll_args* a) {
  (void)a;
  return 1;
}
