/* The communicator object behind ncclComm_t and the checks every entry point
 * applies to it. Created by init.c; transports (src/transport), algorithms
 * and the executor (src/coll, exec.c), the tuner and the engine hang their
 * state off it. */
#ifndef COLLIE_COMM_H
#define COLLIE_COMM_H

#include <pthread.h>

#include "bootstrap/bootstrap.h"
#include "core.h"
#include "graph/calib.h"
#include "transport/transport.h"

#define COMM_MAGIC 0x436f6c6c6965436dULL /* "CollieCm" */
/* Size buckets of the measured choice (coll/adapt.c): floor(log2(bytes)),
 * for each of ADAPT_KINDS collectives. */
#define ADAPT_BUCKETS 40
#define ADAPT_KINDS 6
/* On the alternative, every this many picks of a bucket run the tuner's row
 * once; on the tuner's row, every ADAPT_EXPLORE_ALT run single copy once
 * (the slots' other way every ADAPT_EXPLORE: coll/adapt.c adapt_pick). */
#define ADAPT_EXPLORE 16
#define ADAPT_EXPLORE_ALT (16 * ADAPT_EXPLORE)
/* Below 256 KiB a rank, calls of a bucket that one pick of the path covers. */
#define ADAPT_WINDOW 16

struct tune_memo {
  int valid;
  ncclDataType_t dt;
  size_t count;
  int algo, nch; /* the plan made for it (coll.h): its row in algo_table, channels, chunk, out_far */
  size_t chunk;
  int out_far;
};

struct ncclComm {
  uint64_t magic;
  int rank;
  int nranks;
  uint64_t comm_hash;
  int cuda_dev; /* -1: no device */
  struct bootstrap* bs;
  collie_peer_info_t* peers; /* nranks entries */
  /* By rank: the machine it runs on (topo_machine_hash: NCCL_HOSTID may give
   * ranks of one machine different hosts), and the CPU it last sent to this
   * rank from, as a socket stamps it (-1: unknown, or another machine). */
  uint64_t* machine;
  /* By rank: its process's start time (clock ticks after boot, as
   * /proc/<pid>/stat has it; 0: unknown), which tells a live neighbour on this
   * machine from another process that got its pid (health.c). */
  uint64_t* proc_start;
  int32_t* peer_cpu;
  int machine_size;     /* ranks on this rank's machine */
  int machine_rank;     /* this rank's place among them (by rank) */
  int machine_cpus;     /* CPUs they may use between them (their masks at init; else the online CPUs) */
  int unpair;           /* COLLIE_UNPAIR and every rank of this machine can have a CPU (prim_unpair) */
  int64_t unpair_ns;    /* when a waiter last moved this rank off a CPU it shared with a peer */
  uint64_t unpair_moves;
  /* COLLIE_SPREAD: more local ranks than CPUs, and waiters move this rank to
   * the least crowded CPU when its own has two ranks more (direct_shm.c). */
  int spread;
  int64_t spread_ns; /* when a waiter last looked */
  uint64_t spread_moves;
  uint64_t spread_refused; /* moves not made: another task wanted a CPU */
  size_t op_bytes;      /* the running call's message (count x type size; a point-to-point batch: its largest) */
  uint64_t split_calls;  /* 2-rank single-copy broadcasts so far: the claim word's tag (cma_broadcast.c) */
  uint64_t bcast_pushed; /* blocks a 2-rank single-copy broadcast's root wrote to its reader (cma_broadcast.c; tests) */
  uint64_t reduce_steals; /* chunks a single-copy reduce's root read itself (cma_reduce.c; tests) */
  uint64_t reduce_shared; /* chunks a 2-rank reduce's non-root reduced and wrote to its root (cma_reduce.c; tests) */
  void* reduce_tmp;       /* cma_reduce.c's block buffer (reduce_tmp_bytes), kept between calls */
  size_t reduce_tmp_bytes;
  uint64_t bcast_left;    /* streamed broadcasts' readers this root went on without (direct_shm.c; tests) */
  uint64_t bcast_pulled;  /* streamed broadcasts this reader finished from the root's buffer (direct_shm.c; tests) */
  uint64_t allgather_pulled; /* streamed allgathers run as single copy beside other load (direct_shm.c; tests) */
  int local_rank, local_size, nhosts;
  ncclConfig_t config;
  uint32_t abort_flag;
  ncclResult_t async_error;
  int finalized;
  int broken; /* a collective failed part-way: connectors are poisoned */
  uint32_t nsplits; /* ncclCommSplit calls so far (tags consecutive splits apart) */
  /* Connectors by peer, set up on first use (transport/connect.c). */
  struct conn** send_conns;
  struct conn** recv_conns;
  int nflush_sends; /* TRANSPORT_CAP_FLUSH send connectors: only they can hold unsent bytes */
  /* Bit ch: channel ch has a TRANSPORT_CAP_PROGRESS connector (its bytes move
   * only when a waiter of the channel progresses it: transport_push). */
  unsigned progress_chans;
  int nslots;
  size_t slot_bytes;
  /* The step of collectives that send and receive at once or reduce
   * (transport_chunk_bytes): slot_bytes, or less where the slots are large
   * by default (sockets). */
  size_t pipe_bytes;
  int shm_disable; /* NCCL_SHM_DISABLE, read at init */
  int cma;            /* single copy (process_vm_readv) works between every pair of ranks (transport/cma.c) */
  size_t cma_min_bytes; /* messages at least this big use it: 1 with COLLIE_CMA=1, the tuner's threshold with auto */
  size_t cma_min_stream; /* the same in an alltoall or scatter whose buffers leave the cache (p2p_cma) */
  int64_t timeout_s; /* COLLIE_TIMEOUT, read at init; 0: none */
  int stream_stores; /* COLLIE_STREAM_STORES: -1 auto (the tuner's out_far), 0 never, 1 always, 2 split */
  int slot_stream;   /* COLLIE_SLOT_STREAM: -1 auto (weighed, coll/adapt.c), 0 never, 1 always */
  int slot_far;      /* the running call fills shared-memory slots with non-temporal stores (prim_link.slot_far) */
  int read_ahead_param; /* COLLIE_READ_AHEAD: -1 auto (the tuner's plan.read_ahead), 0 never, 1 always */
  int read_ahead;    /* the running call reduces from shared-memory slots with prefetches ahead (prim_link.ahead) */
  /* Ring orders (graph/rings.c): position -> rank and back, this host's ring,
   * and the ring of host leaders. */
  int *ring, *ring_pos, *local_ring, *leader_ring;
  int nlocal, local_pos, nleaders, leader_pos;
  struct tune_memo memo[8]; /* last plan per collective kind, and the call shape it was made for */
  /* Broadcast [0], allgather [1], alltoall [2], allreduce [3], reduce [4]
   * and reduce-scatter [5] by floor(log2(bytes a rank sends)): calls weighed
   * so far, the path of the last one, and this rank's last measured rate of
   * the tuner's row [0], of its alternative [1] and, where the alternative is
   * single copy, of the tuner's row with non-temporal slot stores [2],
   * bytes/us (coll/adapt.c). */
  struct adapt_bucket {
    uint32_t calls;
    int last;
    float rate[3];
    /* The current window (adapt_window: ADAPT_WINDOW calls below 256 KiB a
     * rank, fewer from there; coll/adapt.c): its calls still to run, its path, and
     * the times (ns) of its calls so far. */
    uint32_t left;
    int cur;
    uint32_t nwin;
    uint32_t win_ns[ADAPT_WINDOW];
  } adapt[ADAPT_KINDS][ADAPT_BUCKETS];
  int algo_mask;  /* 1 << ALGO_* (names) allowed by NCCL_ALGO / NCCL_PROTO */
  int cma_adapt;  /* COLLIE_CMA_ADAPT, read with the masks (coll/adapt.c) */
  /* coll/adapt.c's look at CPU contention: this thread's schedstat at the
   * last look, when it was taken, and the verdict (1: it waited for a CPU). */
  int64_t load_ns, load_run, load_wait;
  int load_busy, load_tid;
  int adapt_load; /* COLLIE_ADAPT_LOAD: -1 auto (look), 0 never held, 1 always (coll/adapt.c) */
  unsigned algo_fallback_warned; /* a bit per collective whose NCCL_ALGO/NCCL_PROTO choice fell back (graph/tuning.c) */
  int proto_mask; /* 1 << PROTO_* allowed by NCCL_PROTO */
  uint64_t opcount; /* calls run so far (NCCL_DEBUG_SUBSYS=COLL logs it) */
  int slot_rotate;      /* COLLIE_SLOT_ROTATE: -1 auto, 0, 1 (transport/shm.c) */
  double oversub;       /* ranks per CPU on the most crowded host, at least 1 */
  double cpus_per_rank; /* CPUs per rank on the most crowded host */
  int max_local;        /* ranks on the most crowded host */
  /* Ranks per CPU on the most crowded machine whose ranks are hosts of their
   * own (NCCL_HOSTID: sockets between them), at least 1. */
  double sock_oversub;
  struct tune_table tune; /* rank 0's tuning table (graph/calib.c): the same on every rank */
  struct ch_pool* chpool; /* channel helper threads (coll/channels.c) */
  int min_ch, max_ch;     /* NCCL_MIN_CTAS / NCCL_MAX_CTAS or the config, clamped to 1..MAX_CHANNELS */
  struct direct_state* direct; /* coll/direct_shm.c mailboxes, set up on first use */
  struct mapped_state* mapped; /* coll/mapped_allreduce.c: peers' buffers mapped, set up on first use */
  struct ncclWindow_vidmem* windows; /* window.c: live memory windows (ncclCommWindowRegister) */
  int64_t spin_ns; /* how long a waiter polls before it yields, then sleeps (COLLIE_SPIN) */
  int64_t sock_yield_ns; /* socket waiters yield between rounds this long before they sleep (COLLIE_SOCKET_YIELD_US) */
  int64_t sock_yields;   /* how often they did (tests) */
  /* Reduction operators created with ncclRedOpCreatePreMulSum, by handle - ncclNumOps. */
  struct user_redop* redops;
  int nredops;
  struct dev_state* dev;     /* device path (device/dev_exec.c), set up on first use */
  struct dev_regs* dev_regs; /* ncclCommRegister's cache (device/dev_api.c) */
  uint64_t reg_gen;          /* ncclCommDeregister calls so far (atomic): kept registrations check it */
  int gdr_state;             /* GPUDirect RDMA for device sends: 0 not probed yet, 1 works, -1 off (transport_dev_send_ok) */
  /* Failures (failures.h): keep-alive ring, nonblocking worker, revoke. */
  struct health* health;
  struct async_worker* async;
  int nonblocking;   /* config.blocking = 0, or NCCL_COMM_BLOCKING=0: work runs on `async` */
  uint32_t revoked;  /* ncclCommRevoke / NCCL_SHRINK_ABORT: running work stops */
  int busy;          /* operations running now: abort frees nothing before 0 (a futex word: comm_wait_idle) */
  /* The same count for the communicator's first calling thread (busy_owner),
   * kept with plain stores: failures.h, comm_busy_enter. */
  uintptr_t busy_owner;
  int busy_fast;
  int stop_fd;       /* eventfd, readable for good after abort, revoke or a recorded failure: waits poll it */
  pthread_mutex_t err_lock;
  char err_msg[512]; /* why async_error was set */
};

struct user_redop {
  int used;
  ncclDataType_t dt;
  int residence; /* ncclScalarResidence_t */
  const void* ptr; /* ncclScalarDevice: read at each call */
  int ptr_on_device; /* ptr is device memory (classified once, at creation): never read by the front */
  uint64_t value;  /* ncclScalarHostImmediate: the bytes of one element */
};

/* Minimum time between two moves of one rank off a CPU it shares with a
 * peer (COLLIE_UNPAIR; ns). */
#define UNPAIR_INTERVAL_NS 2000000
/* The same for calls of at least the size the waiter names (prim_unpair). */
#define UNPAIR_LARGE_INTERVAL_NS 100000000

/* Polls before a waiter first reads the clock (spinning) or yields (no spin
 * time). With more local ranks than CPUs the rank waited for is often on
 * this CPU: 4 polls, not 64, halved small allgather/allreduce at 4 ranks on
 * 2 CPUs (medians of 5 interleaved runs, 32 B-2 KiB: 1.8-3.4 us against
 * 3.3-6.7) and cut alltoall at 8 ranks from 12-20 to 7-9 us. */
static inline int comm_min_polls(const struct ncclComm* comm) { return comm->spin_ns > 0 ? 64 : 4; }

/* A waiter's polling phase: true while it should keep polling. `it` counts
 * polls so far, *t0 holds when polling started (0 until known). */
static inline int comm_keep_polling(const struct ncclComm* comm, int it, int64_t* t0) {
  if (it < comm_min_polls(comm)) return 1;
  int64_t now = time_ns();
  if (*t0 == 0) *t0 = now;
  return now - *t0 < comm->spin_ns;
}

/* NULL or a handle that is not a live communicator -> ncclInvalidArgument
 * with a message naming `fn`. */
ncclResult_t comm_check(ncclComm_t comm, const char* fn);
/* window.c: unmaps and frees the communicator's windows left registered. */
void window_free_all(struct ncclComm* comm);
/* The range registered with ncclCommRegister that holds [p, p+bytes), if
 * any: 1 and [*lo, *hi), else 0. Thread-safe (device/dev_api.c). */
int comm_reg_lookup(struct ncclComm* comm, const void* p, size_t bytes, uintptr_t* lo, uintptr_t* hi);

#endif
