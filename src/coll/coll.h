/* A collective or point-to-point call as the algorithms see it, and the
 * algorithm entry points (one file each). enqueue.c validates API arguments,
 * builds these and runs them (immediately, or at ncclGroupEnd). */
#ifndef COLLIE_COLL_H
#define COLLIE_COLL_H

#include "prims.h"

enum coll_kind {
  COLL_ALLREDUCE,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALLGATHER,
  COLL_REDUCESCATTER,
  COLL_ALLTOALL,
  COLL_GATHER,
  COLL_SCATTER,
  COLL_SEND,
  COLL_RECV,
};
const char* coll_name(int kind);

struct coll_args {
  struct ncclComm* comm;
  int kind;
  const void* sendbuff;
  void* recvbuff;
  size_t count; /* elements, as passed to the API */
  ncclDataType_t dt;
  struct red_op op; /* reductions: resolved operator */
  int avg;          /* ncclAvg: divide the sum by nranks */
  int root;         /* broadcast, reduce, gather, scatter */
  int peer;         /* send, recv */
  const void* scalar_ptr; /* PreMulSum with ncclScalarDevice: read at run time */
  void* stream;           /* the call's cudaStream_t (device buffers) */
  int mem;                /* MEM_HOST / MEM_DEVICE bits of the buffers this rank uses (device/dev_plan.h) */
};

/* Token identifying an operation on a connector: both sides must compute the
 * same value, or the receiver reports the mismatch. */
uint64_t coll_token(const struct coll_args* a, size_t bytes);

/* An ordered set of ranks forming a ring, and this rank's position in it
 * (-1 if it is not a member). graph/rings.c builds them. */
struct ring_view {
  int n;
  const int* ranks;
  int pos;
  int ch; /* channel whose connectors it uses */
};
ncclResult_t rings_init(struct ncclComm* comm);
void rings_free(struct ncclComm* comm);
struct ring_view ring_full(struct ncclComm* comm);    /* every rank, locality order */
struct ring_view ring_local(struct ncclComm* comm);   /* this host's ranks; position 0 is the leader */
struct ring_view ring_leaders(struct ncclComm* comm); /* one leader per host */

ncclResult_t ring_allreduce_view(struct coll_args* a, const struct ring_view* v, const void* sendbuff, void* recvbuff,
                                 const struct red_op* op, int avg_n);
ncclResult_t ring_broadcast_view(struct coll_args* a, const struct ring_view* v, int root_pos, const void* sendbuff,
                                 void* recvbuff);
ncclResult_t ring_reduce_view(struct coll_args* a, const struct ring_view* v, int root_pos, const void* sendbuff,
                              void* recvbuff, int avg_n);
ncclResult_t ring_allgather_view(struct coll_args* a, const struct ring_view* v, size_t off, size_t len);
ncclResult_t ring_reducescatter_view(struct coll_args* a, const struct ring_view* v, size_t off, size_t len);
ncclResult_t hier_allreduce(struct coll_args* a);

/* Several channels (graph/channels.c): the ring collectives split their data
 * across nch rings with their own connectors; channel 0 runs on the calling
 * thread, the others on per-communicator helper threads pinned to CPUs. */
ncclResult_t channels_run(struct coll_args* a, int nch);
void channels_free(struct ncclComm* comm);
int tuning_channels(const struct coll_args* a, int algo);
ncclResult_t ring_allreduce(struct coll_args* a);
ncclResult_t ring_allgather(struct coll_args* a);
ncclResult_t ring_reducescatter(struct coll_args* a);
ncclResult_t ring_broadcast(struct coll_args* a);
ncclResult_t ring_reduce(struct coll_args* a);

/* Point-to-point batch: every op progresses concurrently, so any set of
 * matching sends and receives completes whatever order the ranks posted them in. */
struct p2p_op {
  int peer;
  int is_send;
  char* buf;
  size_t bytes;
  uint64_t token;
  /* progress */
  size_t done;
  int slots_done, nslots;
  struct prim_link link;
};
/* p2p_only: plain send/receive groups (not a collective: no call-board check). */
ncclResult_t p2p_run(struct ncclComm* comm, struct p2p_op* ops, int n, int p2p_only);
/* Alltoall, gather and scatter as point-to-point batches. */
ncclResult_t direct_alltoall(struct coll_args* a);
ncclResult_t direct_gather(struct coll_args* a);
ncclResult_t direct_scatter(struct coll_args* a);

/* One-shot shared-memory algorithms for small messages on one host. */
size_t direct_max_bytes(void);
int direct_eligible(const struct coll_args* a, size_t mailbox_bytes);
ncclResult_t direct_allreduce(struct coll_args* a);
ncclResult_t direct_reduce(struct coll_args* a);
ncclResult_t direct_reducescatter(struct coll_args* a);
ncclResult_t direct_allgather(struct coll_args* a);
ncclResult_t direct_broadcast(struct coll_args* a);
void direct_free(struct ncclComm* comm);
/* The call board (single-host communicators): publish this call's token;
 * while waiting, check that peers on the same call agree. */
ncclResult_t board_publish(struct ncclComm* comm, uint64_t token, int root);
ncclResult_t board_check(struct ncclComm* comm);

ncclResult_t tree_allreduce(struct coll_args* a);

/* One-shot over point-to-point connectors: small messages between hosts. */
size_t net_direct_max_bytes(void);
int net_direct_eligible(const struct coll_args* a, size_t bytes);
ncclResult_t net_direct_run(struct coll_args* a);

/* Tuning (graph/tuning.c): algorithm choice and the cost model. */
enum { ALGO_RING, ALGO_TREE, ALGO_DIRECT, ALGO_HIER, ALGO_COUNT };
const char* algo_name(int algo);
int shm_direct(const struct coll_args* a);
ncclResult_t tuning_init(struct ncclComm* comm); /* reads NCCL_ALGO / NCCL_PROTO */
int cpulist_count(const char* list);
int tuning_choose(const struct coll_args* a);
double algo_estimate_us(const struct coll_args* a, int algo);
/* Predicted time of a call with the algorithm the tuner would pick, microseconds. */
double coll_estimate_us(const struct coll_args* a);

#endif
