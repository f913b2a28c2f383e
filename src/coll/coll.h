/* A collective or point-to-point call as the algorithms see it, the
 * algorithm table (one file and one row per algorithm, algo_table.c), the
 * plan the tuner makes from it and the helpers algorithms share. The API
 * front (enqueue.c) validates arguments and builds coll_args; the executor
 * (exec.c) asks the tuner (graph/tuning.c) for a plan and runs its row. */
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
  int redop;              /* the ncclRedOp_t the user passed (for logs) */
  size_t chunk;           /* bytes a step moves: the plan's (exec.c); 0: a whole slot */
  int out_far;            /* the plan's out_far, unless in place (exec.c) */
  uint64_t op_id;         /* device calls: 1 + the opCount logged when the call was submitted (exec.c); 0: none */
};

/* The call's send and receive buffers overlap (NCCL's in-place forms) on a
 * rank that reads its send buffer (not a broadcast's receivers). */
static inline int coll_in_place(const struct coll_args* a) {
  if (a->kind == COLL_BROADCAST && a->comm->rank != a->root) return 0;
  size_t b = a->count * dtype_size(a->dt), n = (size_t)a->comm->nranks;
  size_t sb = a->kind == COLL_REDUCESCATTER || a->kind == COLL_ALLTOALL ? b * n : b;
  size_t rb = a->kind == COLL_ALLGATHER || a->kind == COLL_ALLTOALL ? b * n : b;
  uintptr_t s = (uintptr_t)a->sendbuff, r = (uintptr_t)a->recvbuff;
  return s && r && s < r + rb && r < s + sb;
}

/* Token identifying an operation on a connector: both sides must compute the
 * same value, or the receiver reports the mismatch (prims.c). */
uint64_t coll_token(const struct coll_args* a, size_t bytes);

/* ---- the algorithm table (algo_table.c) */

/* Algorithm names as NCCL_ALGO spells them; a row names one. ALGO_RING and
 * ALGO_TREE are also bits of comm->algo_mask that the device path reads. */
enum { ALGO_RING, ALGO_TREE, ALGO_DIRECT, ALGO_HIER, ALGO_P2P, ALGO_CMA, ALGO_MAPPED, ALGO_DOUBLING, ALGO_NNAMES };
/* Protocols as NCCL_PROTO spells them. */
enum { PROTO_SIMPLE, PROTO_LL, PROTO_LL128, PROTO_COUNT };
extern const char* const algo_names[ALGO_NNAMES];
extern const char* const proto_names[PROTO_COUNT];
const char* algo_name(int name);

/* Cost of one dependent step and payload bandwidth (bytes per microsecond)
 * between any two ranks of the communicator (link) and between ranks of one
 * host over shared memory (local). The tuner fills it; rows' estimate() use it. */
struct link_cost {
  double alpha_us;
  double bw;
};
struct tune_cost {
  struct link_cost link, local;
  double cma_bw;      /* single copy (process_vm_readv) rate on this host, in the host's cache or streaming */
  double cma_near_bw; /* the same while a reader's data fit in its core's private cache */
  double near_bytes;  /* one core's private cache */
  double cma_call_us; /* the system call and its page pinning */
  int resident;       /* every local rank's send and receive buffers fit the host's cache together */
};
/* What a single-copy message costs besides its bytes: the descriptor out
 * and the release back (two steps) and the system call. */
static inline double tune_cma_handshake_us(const struct tune_cost* c) {
  return 2.0 * c->link.alpha_us + c->cma_call_us;
}
/* The single-copy rate for a reader whose source and destination together
 * take `footprint` bytes: a block that (with room to spare: half of it) fits
 * a core's private cache is read at that cache's rate. */
static inline double tune_cma_bw(const struct tune_cost* c, double footprint) {
  return footprint <= c->near_bytes / 2 ? c->cma_near_bw : c->cma_bw;
}

struct algo;
/* What the executor runs: the chosen row, how many channels, and the chunk
 * (bytes moved per step). Every rank computes the same plan. */
struct plan {
  const struct algo* algo;
  int index; /* in algo_table */
  int nch;
  size_t chunk;
  /* The host's ranks' buffers do not fit its cache together: a reduction's
   * result goes out to memory, written with non-temporal stores (prims.h).
   * OUT_FAR_* bits (graph/tuning.c). */
  int out_far;
  /* A reduction that reads its peers' shared-memory slots with software
   * prefetches ahead (comm->read_ahead for the call; graph/tuning.c). */
  int read_ahead;
};
/* plan.out_far: results and copies into the caller's buffer are streamed... */
#define OUT_FAR_STREAM 1
/* ...also by a reduction step that fills the next send slot in the same pass
 * (prim_recv_reduce_copy; else plain stores there and a copy into the slot). */
#define OUT_FAR_FUSE 2

/* The row may split its data over several channels (graph/channels.c). */
#define ALGO_F_CHANNELS 0x1u

/* An algorithm: one file (ring_allreduce.c, tree_allreduce.c ...) defines
 * its row; algo_table.c lists the rows. eligible() and estimate() must use
 * only what every rank knows alike (arguments, exchanged peer info, shared
 * settings) so all ranks pick the same row. */
struct algo {
  int coll;     /* COLL_* */
  int name;     /* ALGO_* */
  int proto;    /* PROTO_* (NCCL_PROTO filters on it) */
  unsigned flags;
  int (*eligible)(const struct coll_args* a);
  double (*estimate)(const struct coll_args* a, const struct tune_cost* c); /* microseconds */
  ncclResult_t (*run)(struct coll_args* a, const struct plan* p);
};
extern const struct algo* const algo_table[];
extern const int algo_table_len;
/* ceil(log2 n) for n >= 1: the steps of a binomial tree or of recursive
 * doubling over n ranks. */
static inline int coll_ceil_log2(int n) {
  int s = 0;
  while ((1 << s) < n) s++;
  return s;
}

/* The eligible() of a row that can run every call of its collective. */
int algo_always(const struct coll_args* a);

/* One host whose ranks share memory: what the direct mailboxes need. */
static inline int coll_shm_only(const struct ncclComm* comm) { return comm->nhosts == 1 && !comm->shm_disable; }
/* The single-copy rows (cma_*.c): the probe found cross-memory attach
 * working on this one-host communicator and the message (per rank) is at
 * least the point-to-point threshold under COLLIE_CMA=auto (graph/tuning.c;
 * the tuner then weighs the row against the others), any size with
 * COLLIE_CMA=1 (cma_min_bytes 1). */
static inline int coll_cma_eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  return comm->cma && coll_shm_only(comm) && comm->nranks > 1 && bytes >= comm->cma_min_bytes;
}

/* A claim word: work cut into blocks 0..back-1 that two ranks share from
 * both ends, front taken by one, back by the other, each by compare-and-swap
 * of the whole word (cma_reduce.c, cma_broadcast.c); the tag (16 bits) tells
 * one operation's word from the last one's. */
#define CLAIM_BITS 24
#define CLAIM_MAX ((1ull << CLAIM_BITS) - 1)
static inline uint64_t claim_pack(uint64_t tag, uint64_t front, uint64_t back) {
  return tag << 48 | front << CLAIM_BITS | back;
}
static inline uint64_t claim_tag(uint64_t w) { return w >> 48; }
static inline uint64_t claim_front(uint64_t w) { return w >> CLAIM_BITS & CLAIM_MAX; }
static inline uint64_t claim_back(uint64_t w) { return w & CLAIM_MAX; }

/* The bytes one step of an algorithm moves: the plan's chunk, never more
 * than a connector's slot. */
static inline size_t coll_chunk(const struct coll_args* a) {
  size_t slot = a->comm->slot_bytes;
  return a->chunk && a->chunk < slot ? a->chunk : slot;
}

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
/* Several channels (graph/channels.c): the ring collectives split their data
 * across nch rings with their own connectors; channel 0 runs on the calling
 * thread, the others on per-communicator helper threads pinned to CPUs. */
ncclResult_t channels_run(struct coll_args* a, int nch);
void channels_free(struct ncclComm* comm);

/* Point-to-point batch: every op progresses concurrently, so any set of
 * matching sends and receives completes whatever order the ranks posted them in. */
struct p2p_op {
  int peer;
  int is_send;
  char* buf;
  size_t bytes;
  /* An alltoall or a scatter: the bytes its send, slot and receive buffers
   * take on the most crowded host, the same on every rank; 0 for a send or
   * receive of the user's, whose peer cannot know what else this rank's
   * group moves. */
  size_t footprint;
  uint64_t token;
  int cma; /* single copy: a descriptor slot; the receiver reads from the sender's buffer */
  /* Set by the single-copy rows (cma_*.c): single copy at any size. Both
   * ends run the same row, so both decide alike; without it p2p_cma decides. */
  int single_copy;
  int devmem; /* send: buf is device memory only the NIC reads (GPUDirect RDMA: send_commit_dev) */
  /* A message to this rank itself, of a collective whose results bypass the
   * cache (coll_args.out_far): copied with non-temporal stores. */
  int far;
  /* progress */
  size_t done;
  int slots_done, nslots;
  struct prim_link link;
};
/* p2p_only: plain send/receive groups (not a collective: no call-board check). */
ncclResult_t p2p_run(struct ncclComm* comm, struct p2p_op* ops, int n, int p2p_only);
/* Alltoall as one batch of messages (p2p.c), every one by single copy
 * where single_copy is set (the single-copy row, cma_alltoall.c). */
ncclResult_t p2p_alltoall(struct coll_args* a, int single_copy);
/* Messages to self within a batch: the k-th send to this rank pairs with the
 * k-th receive from it. Checks that each has a partner of the same size
 * (ncclInvalidUsage otherwise); with `move`, calls it for every pair that
 * moves bytes (non-empty, between different buffers), in order. The host
 * batch moves them with memmove, a one-rank device group with a copy kernel. */
ncclResult_t p2p_self_pairs(struct ncclComm* comm, const struct p2p_op* ops, int n,
                            ncclResult_t (*move)(void* arg, const struct p2p_op* send, const struct p2p_op* recv),
                            void* arg);
/* One-shot shared-memory mailboxes (direct_shm.c): freed with the communicator. */
void direct_free(struct ncclComm* comm);
/* The mapped allreduce's mappings of peers' buffers (mapped_allreduce.c): freed with the communicator. */
void mapped_free(struct ncclComm* comm);
/* How many peer allocations it holds mapped (tests). */
int mapped_peer_maps(const struct ncclComm* comm);
/* Inside a collective on a one-host communicator: every rank posts `bytes`
 * (at most 4096) from `mine` through its mailbox and gets every rank's, in
 * rank order, in all[nranks * bytes] (all may be NULL: a barrier). Returns
 * once every peer has posted, so it also orders what each did before. */
ncclResult_t direct_shm_share(struct ncclComm* comm, const void* mine, size_t bytes, void* all);
/* Without waiting for anyone: posts this rank's four figures under `key`
 * (below ADAPT_KINDS * ADAPT_BUCKETS) in its mailbox control page and copies
 * every rank's latest under that key, in rank order, to all[4 * nranks]
 * (zeros from a rank that posted none yet, or whose post was being written
 * through a dozen tries, the later ones after giving the CPU away). For choices each rank may make
 * on its own (coll/adapt.c: the slots' stores). Set up on first use, inside
 * a collective, as direct_shm_share. */
ncclResult_t direct_shm_rates(struct ncclComm* comm, int key, const float mine[4], float* all);
/* Rank `rank`'s claim word in the one-shot mailboxes (set up on first use,
 * inside a collective: every rank calls it alike): a 64-bit word every rank
 * of the host may read and compare-and-swap, for rows that share out work
 * (cma_broadcast.c). */
ncclResult_t direct_shm_claim_word(struct ncclComm* comm, int rank, uint64_t** word);
/* The same exchange for a rank that reads nothing: it posts `bytes` from
 * `mine` and returns at once (the peers that call direct_shm_share read it). */
ncclResult_t direct_shm_post(struct ncclComm* comm, const void* mine, size_t bytes);
/* The other ends of direct_shm_post, one direct call each on every rank:
 * fetch waits for rank `from`'s post and copies it into dst (posting
 * nothing); collect waits for every other rank's post and copies rank i's
 * to all + i * bytes (posting nothing). */
ncclResult_t direct_shm_fetch(struct ncclComm* comm, int from, void* dst, size_t bytes);
ncclResult_t direct_shm_collect(struct ncclComm* comm, void* all, size_t bytes);
/* The call board (single-host communicators): publish this call's token;
 * while waiting, check that peers on the same call agree. */
ncclResult_t board_publish(struct ncclComm* comm, uint64_t token, int root);
ncclResult_t board_check(struct ncclComm* comm);
/* Called by a waiter that has polled a while for `peer` (a rank of this
 * one-host communicator): records the CPU this thread runs on, and when the
 * peer last ran on that same CPU (it cannot run while this thread spins)
 * lets it run, by moving this thread to another CPU (COLLIE_UNPAIR,
 * rate-limited) or by yielding. Fails only when the communicator is stopped. */
ncclResult_t board_give_way(struct ncclComm* comm, int peer);
/* COLLIE_SPREAD (direct_shm.c): a waiter that yields, with more local ranks
 * than CPUs, publishes its CPU in its call-board line and, at most every
 * 2 ms, moves itself to a less crowded CPU when it is the rank to move.
 * Nothing before the communicator's first one-shot call (no board yet). */
void board_spread(struct ncclComm* comm);

/* ---- tuning (graph/tuning.c): the cost model and the choice of a row */

ncclResult_t tuning_init(struct ncclComm* comm); /* reads NCCL_ALGO / NCCL_PROTO */
/* The plan for a call: the cheapest eligible row the user allows
 * (memoised per call shape). */
ncclResult_t tuning_plan(const struct coll_args* a, struct plan* p);
/* The plan the tuner would make if the rows named `skip` (an ALGO_*) did
 * not exist (not memoised): what a row that finds at run time that it
 * cannot run (the mapped allreduce) runs instead. */
ncclResult_t tuning_plan_but(const struct coll_args* a, int skip, struct plan* p);
/* Predicted time of a call with the row the tuner would pick, microseconds. */
double coll_estimate_us(const struct coll_args* a);
/* The row (index in algo_table) the tuner picks for a call under table t
 * (NULL: the communicator's), and its predicted time; -1 if none. Tests and
 * collie-info use it. */
int tuning_choose(const struct coll_args* a, const struct tune_table* t, double* est_us);
/* COLLIE_CMA=auto: sets comm->cma_min_bytes and cma_min_stream from the agreed table (graph/tuning.c). */
void tuning_cma_thresholds(struct ncclComm* comm);
/* Whether a point-to-point message of `bytes` in a call whose buffers take
 * `footprint` bytes of the host (p2p_op) goes by single copy on a connector
 * that can: from cma_min_bytes, or from cma_min_stream once the footprint
 * exceeds the cache, counted oversub times where ranks take turns on a CPU
 * (a slot waits for its reader while the CPU's other ranks run through
 * their own buffers). Depends only on what both ends know alike. */
static inline int p2p_cma(const struct ncclComm* comm, size_t bytes, size_t footprint) {
  size_t min = comm->cma_min_bytes;
  if (footprint && (double)footprint * comm->oversub > comm->tune.cache_bytes) min = comm->cma_min_stream;
  return bytes > 0 && bytes >= min;
}
/* Paths weighed by measurement (adapt.c): for a collective of 32 KiB a rank
 * or more on one host, adapt_plan agrees with the other ranks (one mailbox
 * exchange once a window of calls: adapt_window) on
 * running the tuner's row as it is or its alternative (the single-copy row
 * for a broadcast, allgather or alltoall; the same row with non-temporal
 * stores into the FIFO's slots otherwise), by the rates the ranks measured
 * for that collective and size lately, and starts the clock; adapt_done
 * stops it, keeps the call's time for its window's rate and puts back what
 * the call changed. */
struct adapt_ticket {
  struct adapt_bucket* bucket; /* NULL: not weighed */
  struct ncclComm* comm;
  int64_t start_ns;
};
ncclResult_t adapt_plan(struct coll_args* a, struct plan* p, struct adapt_ticket* t);
/* res: how the call ended (only a successful call's time is kept). */
void adapt_done(const struct adapt_ticket* t, ncclResult_t res);
/* The first picks of a bucket, which try each path once and the tuner's
 * row again: adapt_pick's (two paths) and adapt_pick3's (three). */
#define ADAPT_TRIES 3u
#define ADAPT_TRIES3 4u
/* The rule, alike on every rank: 1 for the alternative at the bucket's call
 * number `call`, given the slowest rank's rates (bytes/us); *trial is
 * set where the call runs a path to measure it, not because it is faster. */
int adapt_pick(uint32_t call, double rate_plan, double rate_alt, int slots, int* trial);
int adapt_pick3(uint32_t call, const double rate[3], int slots1, int* trial);
/* How much faster the alternative must have measured to be taken: `slots`
 * (the alternative is the slots' other way) ADAPT_SLOTS_MARGIN, else
 * (single copy) ADAPT_MARGIN; adapt_pick3 weighs the FIFO's two ways with
 * ADAPT_SLOTS_MARGIN and path [1] against the better of them as `slots1`
 * says. Single copy only where it measured clearly faster: outside
 * the slow stretches the two differ by 5-20% and one call's time by as
 * much, inside them by 3-4x, and a lone single-copy call among FIFO calls
 * costs 3-4x one in a run of them. The slots' stores (and a reduction's
 * read-ahead) are the same row written or read another way: a wrong pick
 * costs what the two differ by, no more. With 1.3 there too, non-temporal
 * slot stores that measured 1.1-1.25x faster outside the slow stretches
 * were never taken (2 ranks on 2 CPUs, medians of 5 interleaved rounds, us,
 * 1.3 / 1.08, bound: allgather 2 MiB 81.2 / 68.4, reduce 32 KiB 2.93 / 2.36,
 * 512 KiB 38.7 / 31.7, reduce-scatter 128 KiB 8.30 / 6.76, alltoall 512 KiB
 * 20.5 / 19.2; unbound: alltoall 2 MiB 91.7 / 88.0, allgather 2 MiB 79.8
 * / 69.1, broadcast 128 KiB 5.42 / 4.71; allreduce and reduce-scatter of 2
 * and 8 MiB even over 9 rounds; docs/BENCHMARKS.md, seventy-second
 * session). */
#define ADAPT_MARGIN 1.3
#define ADAPT_SLOTS_MARGIN 1.08
/* The calls a pick covers, alike on every rank: from the bytes a rank moves,
 * the bucket's picks so far and the number of first picks that try paths. */
uint32_t adapt_window(size_t bytes, uint32_t calls, uint32_t tries);
/* Whether a rank waits for a CPU, from its thread's time on a CPU and time
 * runnable but waiting over the `since_ns` since its last look (ns); `was`,
 * the last verdict, stands where the look saw too little runnable time.
 * Pure. */
#define ADAPT_LOAD_PERCENT 15
int adapt_load_verdict(int64_t run_ns, int64_t wait_ns, int64_t since_ns, int was);
/* A state decided by looks (direct_shm.c, whether other tasks want a CPU):
 * it becomes what a look saw only where the look before saw the same;
 * *last_look keeps the latest look. Returns the state. */
int look_confirmed(int state, int* last_look, int look);

/* collie-info --tuning: the table and every collective's choice per size
 * (8 B .. 256 MiB, steps of `factor`) at nranks ranks on this host. */
ncclResult_t tuning_report(FILE* f, int nranks, int factor);

#endif
