/* collie's own extensions to the NCCL API: library version, launcher-aware
 * world initialisation and per-peer information. Everything here is exported
 * with the collie_ prefix; the NCCL API itself is in nccl.h. */
#ifndef COLLIE_H_
#define COLLIE_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/** collie's own version (the NCCL API level it implements is NCCL_VERSION_CODE). */
#define COLLIE_VERSION_MAJOR 0
#define COLLIE_VERSION_MINOR 1
#define COLLIE_VERSION_PATCH 0
#define COLLIE_VERSION_CODE (COLLIE_VERSION_MAJOR * 10000 + COLLIE_VERSION_MINOR * 100 + COLLIE_VERSION_PATCH)

/**
 * @brief Version of the loaded collie library.
 * @return COLLIE_VERSION_CODE of the library (not of this header).
 * Thread-safe.
 */
int collie_version(void);

/**
 * @brief Creates the world communicator from whatever launcher started the process.
 *
 * Rank and size come from the first complete set found among: collie-run
 * (COLLIE_RANK, COLLIE_SIZE), Open MPI (OMPI_COMM_WORLD_RANK/SIZE), PMI
 * (PMI_RANK/PMI_SIZE), Slurm (SLURM_PROCID/SLURM_NTASKS) and torchrun-style
 * RANK/WORLD_SIZE. The bootstrap root is NCCL_COMM_ID when set, otherwise
 * MASTER_ADDR with port MASTER_PORT+1 (MASTER_PORT itself belongs to the
 * launcher's own store); rank 0 serves the root. COLLIE_BOOTSTRAP_SECRET, when
 * the launcher sets it (collie-run does), authenticates the bootstrap.
 *
 * @param [out] comm  the new communicator
 * @return ncclSuccess; ncclInvalidArgument if comm is NULL; ncclInvalidUsage
 *         if no launcher environment or root address is found (the message
 *         from ncclGetLastError says what is missing); any ncclCommInitRank error.
 * Blocking: returns when all ranks have joined, or on error/timeout.
 */
ncclResult_t collie_comm_init_from_env(ncclComm_t* comm);

/** What a communicator learned about one of its ranks at init. */
typedef struct {
  size_t size;            /**< [in] sizeof(collie_peer_info_t) as compiled by the caller */
  int rank;               /**< rank in the communicator */
  int pid;                /**< process id on its host */
  uint64_t host_hash;     /**< hash of hostname + boot id, or of NCCL_HOSTID */
  char hostname[64];      /**< host name (NCCL_HOSTID when set) */
  int numa_node;          /**< NUMA node the process is bound to or runs on; -1 unknown */
  char cpuset[128];       /**< CPUs the process may run on, as a list ("0-3,8") */
  int cuda_dev;           /**< CUDA device index, -1 when none */
  char pci_bus_id[32];    /**< PCI bus id of that device, "" when none */
  int local_rank;         /**< index among the ranks with the same host_hash */
  int local_size;         /**< number of ranks with that host_hash */
} collie_peer_info_t;

/**
 * @brief Copies what `comm` knows about `rank`.
 * @param [in]  comm  communicator
 * @param [in]  rank  0..ncclCommCount-1
 * @param [in,out] info  info->size must be set by the caller; at most that many bytes are written
 * @return ncclSuccess, or ncclInvalidArgument for a bad comm, rank, info or info->size.
 * Thread-safe.
 */
ncclResult_t collie_comm_peer_info(ncclComm_t comm, int rank, collie_peer_info_t* info);

/**
 * @brief Where rank `rank`'s part of a memory window lies in this process.
 *
 * Host windows are a collie extension of ncclCommWindowRegister: a range of
 * host memory from ncclMemAlloc (what it returns without a CUDA device, or
 * with COLLIE_MEMALLOC=host) that every rank registers in one collective
 * call. Each rank then maps the windows of the ranks on its own host, and
 * this call gives the address of one of them, as MPI_Win_shared_query does:
 * loads and stores through it reach the peer's memory directly (order them
 * with a collective, e.g. a one-element ncclAllReduce, as with
 * MPI_Win_sync + a barrier). Valid until ncclCommWindowDeregister, which
 * every rank must call before it frees the memory (ncclMemFree returns the
 * pages at once, also to the peers that map them).
 *
 * @param [in]  comm  the communicator the window was registered with
 * @param [in]  win   the window (from ncclCommWindowRegister)
 * @param [in]  rank  0..ncclCommCount-1; this rank gives its own buffer
 * @param [out] ptr   the address of that rank's window here
 * @param [out] size  (may be NULL) the size that rank registered
 * @return ncclSuccess; ncclInvalidArgument for a bad comm, window, rank or
 *         ptr; ncclInvalidUsage if `rank` runs on another host (nothing is
 *         mapped; *ptr is NULL).
 * Thread-safe while the window stays registered.
 */
ncclResult_t collie_window_peer_ptr(ncclComm_t comm, ncclWindow_t win, int rank, void** ptr, size_t* size);


/* ------------------------------------------------------------------------ */
/* Engine: Horovod-style named, asynchronous collectives (src/engine).       */
/*                                                                           */
/* A background thread per process takes requests from any thread, agrees   */
/* with the other ranks (through the coordinator, rank 0 of each process     */
/* set, or the response cache) on which named tensors every rank has         */
/* submitted, and runs them in one order on all ranks, fusing small          */
/* allreduces. Ranks may submit the same names in different orders.          */
/*                                                                           */
/* Every function returns 0 (or a handle / value >= 0) on success and a      */
/* negative collie_status_t on failure; collie_last_error() then says why.   */
/* All functions are thread-safe once collie_init* has returned.             */
/* ------------------------------------------------------------------------ */

/** Negative return codes of the engine API. */
typedef enum {
  COLLIE_OK = 0,
  COLLIE_ERR_INVALID_ARGUMENT = -1, /**< bad pointer, count, dtype, op, root, handle or set */
  COLLIE_ERR_NOT_INITIALIZED = -2,  /**< collie_init* not called, or after collie_shutdown */
  COLLIE_ERR_MISMATCH = -3,         /**< ranks disagree on op, dtype, shape, root or scaling */
  COLLIE_ERR_COMMUNICATION = -4,    /**< the collective failed (peer lost, timeout, NCCL error) */
  COLLIE_ERR_STALLED = -5,          /**< failed by the stall inspector (COLLIE_STALL_SHUTDOWN_TIME_SECONDS) */
  COLLIE_ERR_SHUTDOWN = -6,         /**< the engine shut down before the operation finished */
  COLLIE_ERR_INTERNAL = -7,         /**< out of memory or another local failure */
  COLLIE_ERR_MEMBERSHIP = -8        /**< elastic: the set of workers changed; re-initialise */
} collie_status_t;

/** Reduction operations (values follow Horovod's ReduceOp; 2, Adasum, is not offered). */
typedef enum {
  COLLIE_AVERAGE = 0,
  COLLIE_SUM = 1,
  COLLIE_MIN = 3,
  COLLIE_MAX = 4,
  COLLIE_PRODUCT = 5
} collie_op_t;

/** The process set every rank belongs to. */
#define COLLIE_WORLD 0

/** Text of the calling thread's last engine error ("" if none). Never NULL. */
const char* collie_last_error(void);

/**
 * @brief Starts the engine on a world communicator built from the launcher's
 * environment (as collie_comm_init_from_env). Collective over all ranks.
 * @return 0; COLLIE_ERR_INVALID_ARGUMENT if already initialised; another
 *         negative code if the communicator or the thread cannot be created.
 */
int collie_init(void);

/**
 * @brief Starts the engine on an existing communicator (collective over it).
 * The engine uses `comm` (it does not duplicate it) and never destroys it;
 * the caller must not use `comm` for other work until collie_shutdown().
 */
int collie_init_comm(ncclComm_t comm);

/**
 * @brief Stops the engine: pending handles fail with COLLIE_ERR_SHUTDOWN,
 * the timeline is closed, process-set communicators are destroyed (and the
 * world one when collie_init created it). Collective; safe to call twice.
 * As in Horovod, the request travels with the next cycle: one rank's
 * shutdown stops every rank's engine (their pending handles and later
 * submissions fail with COLLIE_ERR_SHUTDOWN; they still call
 * collie_shutdown to free it). Operations already agreed finish first.
 * Bounded: if peers are gone, it returns after the communicator's failure
 * detection (COLLIE_PEER_TIMEOUT), aborting the engine's communicators.
 */
int collie_shutdown(void);

/** 1 when the engine runs, else 0. */
int collie_is_initialized(void);
/** Rank in the world / number of ranks / rank and count on this host /
 *  index of this host and number of hosts. Negative if not initialised. */
int collie_rank(void);
int collie_size(void);
int collie_local_rank(void);
int collie_local_size(void);
int collie_cross_rank(void);
int collie_cross_size(void);

/**
 * @brief Queues an allreduce of `count` elements under `name`.
 * recvbuf may equal sendbuf. Result = postscale * op(prescale * x_r) over the
 * ranks of `process_set` (COLLIE_AVERAGE divides by its size). Scale factors
 * apply to floating-point dtypes only and must be 1.0 otherwise.
 * Buffers must stay valid until the handle completes.
 * Names identify operations across ranks; a name may not be pending twice in
 * one set. A NULL name is replaced by "collie.noname.<kind>.<n>" from a
 * per-set counter, so ranks must submit unnamed operations in the same order.
 * @return a handle >= 0, or a negative collie_status_t.
 */
int collie_allreduce_async(const char* name, const void* sendbuf, void* recvbuf, size_t count,
                           ncclDataType_t dtype, int op, double prescale, double postscale,
                           int process_set);

/**
 * @brief Queues n allreduces that are negotiated and executed together
 * (names[i], sendbufs[i], recvbufs[i], counts[i]); one handle for the group.
 * No member runs before every rank of the set has submitted every member;
 * then all members run in the same cycle, fused into one batch as far as
 * COLLIE_FUSION_THRESHOLD allows. A tensor that any rank submits as part of a
 * group is held for the whole group on every rank, even where another rank
 * submits it alone. If ranks disagree on any member (count, dtype, op, scale
 * factors), or a member stalls past COLLIE_STALL_SHUTDOWN_TIME_SECONDS, the
 * whole group fails on every rank (no member is reduced) and the handle's
 * error names the offending member.
 * @return a handle >= 0, or a negative collie_status_t.
 */
int collie_grouped_allreduce_async(int n, const char* const* names, const void* const* sendbufs,
                                   void* const* recvbufs, const size_t* counts,
                                   ncclDataType_t dtype, int op, double prescale,
                                   double postscale, int process_set);

/**
 * @brief Queues an allgather; `count` may differ per rank. The output (the
 * ranks' buffers concatenated in rank order) is allocated by the engine:
 * collie_result() returns it, collie_result_counts() the count of each rank.
 */
int collie_allgather_async(const char* name, const void* sendbuf, size_t count,
                           ncclDataType_t dtype, int process_set);

/**
 * @brief As collie_allgather_async for a tensor of `ndim` dimensions:
 * ranks must agree on every dimension but the first (checked during
 * negotiation); count = product of shape.
 */
int collie_allgather_nd_async(const char* name, const void* sendbuf, int ndim,
                              const int64_t* shape, ncclDataType_t dtype, int process_set);

/** @brief Queues an in-place broadcast of `count` elements from `root` (rank in the set). */
int collie_broadcast_async(const char* name, void* buf, size_t count, ncclDataType_t dtype,
                           int root, int process_set);

/**
 * @brief Queues an all-to-all: sendcounts[j] elements (consecutive in sendbuf)
 * go to rank j of the set; sendcounts has collie_process_set_size() entries.
 * The output is allocated by the engine; collie_result_counts() gives the
 * count received from each rank. While some ranks have joined (collie_join),
 * a joined rank sends zero elements to every rank, and what the others send
 * to it is dropped (it has no handle to receive it): sendcounts keep one
 * entry per rank of the set, joined ones included.
 */
int collie_alltoall_async(const char* name, const void* sendbuf, const size_t* sendcounts,
                          ncclDataType_t dtype, int process_set);

/**
 * @brief Queues a reduce-scatter of `count` elements: rank r of the set gets
 * count / size elements, plus one if r < count % size (Horovod's split), at
 * offset sum of the counts of the ranks before it. Output allocated by the engine.
 */
int collie_reducescatter_async(const char* name, const void* sendbuf, size_t count,
                               ncclDataType_t dtype, int op, int process_set);

/**
 * @brief Declares that this rank has no more work this epoch (world set).
 * Until every rank has joined, this rank takes part in other ranks'
 * allreduces with the reduction's identity (zeros for sum: averages still
 * divide by the full size), allgathers and alltoalls with zero elements
 * (alltoall data sent to it is dropped), and broadcasts. Blocks until all ranks
 * have joined. @return the last rank to join, or a negative code.
 */
int collie_join(void);

/** @brief Blocks until every rank of the set reaches it. @return 0 or a negative code. */
int collie_barrier(int process_set);

/*
 * Handles: ids only grow (they wrap at INT_MAX, skipping ids still in use),
 * and stay unique across collie_shutdown / collie_init cycles of a process,
 * so an id that was released, or never issued, is refused by every call
 * below with COLLIE_ERR_INVALID_ARGUMENT (collie_handle_error returns "")
 * instead of naming a later operation. Thread-safe.
 */
/** 1 if the handle is done (success or error), 0 if pending, negative if invalid. */
int collie_poll(int handle);
/** Blocks until done. @return 0 on success or the operation's negative code. */
int collie_wait(int handle);
/**
 * @brief Engine-allocated output of a finished allgather / alltoall /
 * reducescatter: *buf stays valid until collie_release(handle); *count is
 * its number of elements. Either pointer may be NULL.
 */
int collie_result(int handle, void** buf, size_t* count);
/** Per-rank element counts of an allgather / alltoall result (set size entries). */
int collie_result_counts(int handle, size_t* counts);
/** Error text of a failed handle ("" if none). Valid until collie_release. */
const char* collie_handle_error(int handle);
/** Frees the handle (and its engine-allocated output). A pending handle is waited for first. */
int collie_release(int handle);

/**
 * @brief Registers a process set: `n` distinct world ranks, in any order
 * (sorted by the engine). Collective over the world: every rank calls it with
 * the same list, members or not. @return the set's id (> 0) or a negative code.
 */
int collie_add_process_set(const int* ranks, int n);
/** Collective over the world; the id must not be in use by pending operations. */
int collie_remove_process_set(int id);
/** Rank of this process in the set; negative if not a member or no such set. */
int collie_process_set_rank(int id);
/** Number of ranks in the set; negative if no such set. */
int collie_process_set_size(int id);
/** 1 if this process is a member, 0 if not, negative if no such set. */
int collie_process_set_included(int id);

/** Counters of this process's engine since collie_init* (tests, tuning). */
typedef struct {
  size_t size;              /**< [in] sizeof(collie_engine_stats_t) as compiled by the caller */
  uint64_t cycles;          /**< background cycles run */
  uint64_t cache_hits;      /**< operations agreed through the response cache (bit vector only) */
  uint64_t cache_misses;    /**< operations agreed through the coordinator's request/response exchange */
  uint64_t exchanges;       /**< cycles that needed that exchange */
  uint64_t collectives;     /**< allreduce collectives run for tensors (a fused batch counts once) */
  uint64_t fused_tensors;   /**< tensors that went through the fusion buffer */
  uint64_t tensors;         /**< operations completed (success or error) */
  uint64_t bytes_reduced;   /**< allreduce payload bytes */
  int64_t fusion_threshold; /**< current (agreed) fusion threshold in bytes; autotune may change it */
  double cycle_time_ms;     /**< current cycle time */
  uint64_t negotiate_ns;    /**< time spent agreeing (bit-vector allreduce, exchanges), waiting for other ranks included */
} collie_engine_stats_t;

/**
 * @brief Copies the engine's counters.
 * @param [in,out] stats  stats->size must be set; at most that many bytes are written
 * @return 0, COLLIE_ERR_NOT_INITIALIZED or COLLIE_ERR_INVALID_ARGUMENT. Thread-safe.
 */
int collie_engine_stats(collie_engine_stats_t* stats);

/**
 * @brief Starts writing a Chrome-trace JSON timeline (rank 0 writes; other
 * ranks accept the call and do nothing). mark_cycles != 0 marks each cycle.
 */
int collie_start_timeline(const char* path, int mark_cycles);
/** Stops the timeline and closes the file as valid JSON. */
int collie_stop_timeline(void);

/* ------------------------------------------------------------------------ */
/* Elastic: training that survives lost workers and takes in new ones        */
/* (src/elastic).                                                            */
/*                                                                           */
/* Workers are started by `collie-run --elastic --min N --max M` or by any   */
/* launcher with a `collie-rendezvous` store (COLLIE_RENDEZVOUS and          */
/* COLLIE_RENDEZVOUS_SECRET in their environment). Each membership epoch has */
/* an ordered plan (oldest worker first, so rank 0 is the oldest survivor);  */
/* the engine runs on that epoch's world. A training loop registers its      */
/* state, commits it at consistent points, and on COLLIE_ERR_COMMUNICATION   */
/* (a peer died) or COLLIE_ERR_MEMBERSHIP (workers joined or left) calls     */
/* collie_elastic_reset(), which rebuilds the world and brings every worker  */
/* to rank 0's last commit:                                                  */
/*                                                                           */
/*   collie_elastic_init();                                                  */
/*   collie_elastic_state_add("w", w, sizeof w); ... collie_elastic_state_sync(); */
/*   while (step < n) {                                                      */
/*     int rc = train_step();                     (engine ops)               */
/*     if (rc == 0) { step++; collie_elastic_state_commit();                 */
/*                    rc = collie_elastic_check(); }                         */
/*     if (rc == COLLIE_ERR_COMMUNICATION || rc == COLLIE_ERR_MEMBERSHIP)    */
/*       if (collie_elastic_reset() != 0) fail(collie_last_error());         */
/*   }                                                                       */
/*   collie_elastic_shutdown();                                              */
/*                                                                           */
/* These functions are called from one thread (the training loop). Errors    */
/* are negative collie_status_t values; the text is in collie_last_error()   */
/* and ncclGetLastError(NULL).                                               */
/* ------------------------------------------------------------------------ */

/**
 * @brief Joins the job: registers with the rendezvous store, waits for an
 * epoch, builds its communicator (rank 0 creates the unique ID and publishes
 * it through the store) and starts the engine on it (collie_init_comm).
 * A worker that joins a running job waits until the running workers notice
 * (collie_elastic_check) and re-form the world with it.
 * @return 0; COLLIE_ERR_INVALID_ARGUMENT if already initialised or the
 *         environment is incomplete; COLLIE_ERR_MEMBERSHIP if the store refused
 *         this worker (its slot is excluded) or the job failed (reset limit);
 *         COLLIE_ERR_COMMUNICATION if the store cannot be reached or the
 *         rendezvous timed out (COLLIE_ELASTIC_TIMEOUT).
 */
int collie_elastic_init(void);

/**
 * @brief Leaves the job cleanly (not counted as a failure): stops the engine,
 * destroys the communicator, tells the store and frees the state copies.
 * Collective over the current world when the world is healthy. Safe to call twice.
 */
int collie_elastic_shutdown(void);

/**
 * @brief Registers `bytes` bytes at `ptr` as part of the training state under
 * `name` (at most 127 characters). Every worker must register the same names
 * and sizes in the same order. The memory must stay valid until shutdown.
 * @return 0, or COLLIE_ERR_INVALID_ARGUMENT (NULL, duplicate name).
 */
int collie_elastic_state_add(const char* name, void* ptr, size_t bytes);

/** @brief Saves a copy of every registered buffer (local, no communication). */
int collie_elastic_state_commit(void);

/** @brief Copies the last commit back into the registered buffers (local). */
int collie_elastic_state_restore(void);

/**
 * @brief Collective: checks that all workers registered the same state
 * (COLLIE_ERR_MISMATCH otherwise), broadcasts every buffer from rank 0 (the
 * oldest worker) and commits the result. Called once after the state is
 * registered; collie_elastic_reset() calls it itself.
 */
int collie_elastic_state_sync(void);

/**
 * @brief Collective: asks the store whether the membership changed (a worker
 * is waiting to join, or a member died or went back to the rendezvous) and
 * agrees on the answer with every rank (an engine allreduce), so all ranks
 * return the same value at the same step.
 * @return 0; COLLIE_ERR_MEMBERSHIP: call collie_elastic_reset();
 *         COLLIE_ERR_COMMUNICATION: the agreement failed (a peer is lost):
 *         call collie_elastic_reset().
 */
int collie_elastic_check(void);

/**
 * @brief Rebuilds the world after a failure or a membership change: stops the
 * engine, aborts (broken) or destroys (healthy) the communicator, waits for
 * the next epoch, builds its communicator and engine, restores the last
 * commit and syncs it from the new rank 0 (the oldest surviving worker).
 * Retries by itself when another worker fails meanwhile.
 * @return 0; COLLIE_ERR_MEMBERSHIP when the job has failed (reset limit
 *         reached, too few workers) or this worker was excluded;
 *         COLLIE_ERR_COMMUNICATION when the store is unreachable or the
 *         rendezvous timed out. After an error the loop should exit.
 */
int collie_elastic_reset(void);

/** This worker's id in the store (1, 2, ... in registration order); negative if not initialised. */
int collie_elastic_worker_id(void);
/** The current membership epoch (1 for the first world); negative if not initialised. */
int collie_elastic_epoch(void);
/** Number of resets the job has gone through (epochs after the first) as of this worker's last rendezvous. */
int collie_elastic_resets(void);
/** The current epoch's communicator (owned by the elastic layer and used by the engine); NULL if none. */
ncclComm_t collie_elastic_comm(void);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_H_ */
