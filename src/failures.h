/* Failure handling inside one process: the keep-alive ring that turns a dead,
 * closed or silent peer into an error on every rank (health.c), the
 * background worker of nonblocking communicators (async.c), and the
 * communicator's error record shared by both and by enqueue.c / init.c.
 * ncclCommShrink and ncclCommRevoke live in shrink.c. */
#ifndef COLLIE_FAILURES_H
#define COLLIE_FAILURES_H

#include "comm.h"
#include "comm_err.h"

/* ---- error record: comm_err.h (below the transports, which use it too) */

/* ---- keep-alive ring (health.c) */

/* Collective over the communicator (after the bootstrap): connects each
 * rank to its ring neighbours and starts the watchdog thread. Reads
 * COLLIE_PEER_TIMEOUT. No-op for one rank. */
ncclResult_t health_init(struct ncclComm* comm, int lfd, const union sock_addr* prev_addr);
/* The keep-alive listener (on `near`'s interface, any port), opened before
 * the bootstrap so that its address reaches the ring neighbours in this
 * rank's bootstrap card (init.c); health_init takes it over (`lfd`, closed on
 * every path) with the predecessor's address from its card. */
ncclResult_t health_listen(const union sock_addr* near, int listen_any, int* fd, union sock_addr* addr);
/* `peer` left the communicator on purpose (destroy, or an idle abort): a
 * shared-memory waiter for it that still finds nothing fails with
 * comm_left_error (comm_err.h) instead of waiting forever. Socket waiters need no such
 * check: the transport sees the close, after any bytes still in flight. */
int health_peer_left(struct ncclComm* comm, int peer);
/* For tests: this rank's keep-alive thread sends no ping for `ms`
 * milliseconds, as a rank that gets no CPU looks to its neighbours. */
void health_mute(struct ncclComm* comm, int64_t ms);
/* Wakes every sleeping waiter of the communicator (after abort, revoke or a
 * recorded failure: each then ends with the reason). Any thread. */
void comm_wake_waiters(struct ncclComm* comm);
/* Stops the thread and closes the connections. `goodbye`: tell the
 * neighbours this rank leaves on purpose (else they report it failed).
 * Idempotent. */
void health_stop(struct ncclComm* comm, int goodbye);

/* ---- nonblocking communicators (async.c) */

struct task; /* enqueue.c: a queued collective or point-to-point call */

/* Starts the worker of a nonblocking communicator: it runs init(comm, arg)
 * first (ncclCommGetAsyncError reads ncclInProgress meanwhile), then the
 * queued work in order. free_arg(arg) is called once init has run. */
ncclResult_t async_start(struct ncclComm* comm, ncclResult_t (*init)(struct ncclComm*, void*), void* arg,
                         void (*free_arg)(void*));
/* Queues a list of tasks of this communicator (ownership passes). */
void async_push(struct ncclComm* comm, struct task* list);
/* Work queued or running (init included). */
int async_pending(struct ncclComm* comm);
/* Waits until nothing is queued or running. */
void async_drain(struct ncclComm* comm);
/* Stops the worker: queued work is dropped if `cancel` (the abort flag or
 * revoke makes running work end), else finished first. Idempotent. */
void async_stop(struct ncclComm* comm, int cancel);
/* Turns a nonblocking communicator whose init succeeded and which has nothing
 * queued into a blocking one (its worker stops; later calls run on the
 * caller's thread). For a caller that wanted only a cancellable init
 * (src/elastic). Not thread-safe: no other thread may use comm meanwhile. */
ncclResult_t async_make_blocking(struct ncclComm* comm);

/* enqueue.c: whether the calling thread is inside ncclGroupStart/End. */
int group_active(void);
/* enqueue.c: a blocking communicator whose init was called inside a group:
 * its init runs on its worker (async_start) and ncclGroupEnd waits for it,
 * so that one thread can create several ranks' communicators in one group,
 * as with NCCL. */
ncclResult_t group_defer_init(struct ncclComm* comm);

/* enqueue.c: runs a task list of one communicator and frees it. */
ncclResult_t enqueue_run_list(struct task* list);
/* enqueue.c: frees a task list without running it. */
void enqueue_free_list(struct task* list);

/* init.c: the common init path (also used by split and shrink). */
ncclResult_t comm_init(ncclComm_t* newcomm, int nranks, int nids, const ncclUniqueId* ids, int rank,
                       const ncclConfig_t* config, const char* fn);

/* comm->busy counts running operations; this bit is set while comm_wait_idle
 * sleeps on it, so only then does the last operation out pay for a wake. */
#define COMM_BUSY_WAITER 0x40000000
/* 1 once the process could register for membarrier(PRIVATE_EXPEDITED). */
extern int comm_busy_fast_ok;
/* Registers the process for membarrier once; comm_init calls it. */
void comm_busy_setup(void);

/* Starts an operation on comm (exec_run_tasks): abort and revoke free
 * nothing while it runs. Returns what comm_busy_leave needs. A locked
 * read-modify-write of comm->busy at the start and the end of every call
 * made each one wait for the stores before it to reach the cache (a third of
 * a 2-rank 8 B shared-memory broadcast root's time, ~20 ns a call): the
 * communicator's first calling thread counts in busy_fast with plain stores
 * instead, and a thread that looks (comm_busy_count, comm_wait_idle) makes
 * them visible first with membarrier(), which runs a full barrier on every
 * CPU running one of this process's threads. Any other thread, and every
 * thread where membarrier is refused, uses the locked counter. */
static inline int comm_busy_enter(struct ncclComm* comm) {
  uintptr_t self = (uintptr_t)pthread_self();
  uintptr_t owner = __atomic_load_n(&comm->busy_owner, __ATOMIC_RELAXED);
  if (owner != self &&
      (owner != 0 || !comm_busy_fast_ok ||
       !__atomic_compare_exchange_n(&comm->busy_owner, &owner, self, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))) {
    __atomic_add_fetch(&comm->busy, 1, __ATOMIC_ACQ_REL);
    return 0;
  }
  /* Only the owner writes busy_fast (a call may nest: a count, not a flag). */
  __atomic_store_n(&comm->busy_fast, __atomic_load_n(&comm->busy_fast, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  return 1;
}
/* Ends an operation counted in comm->busy and wakes comm_wait_idle: the
 * caller's last touch of comm. */
void comm_busy_exit(struct ncclComm* comm);
/* Ends what comm_busy_enter started (`fast` is what it returned): the
 * caller's last touch of comm. A waiter for busy_fast polls (no wake). */
static inline void comm_busy_leave(struct ncclComm* comm, int fast) {
  if (!fast) {
    comm_busy_exit(comm);
    return;
  }
  __atomic_store_n(&comm->busy_fast, __atomic_load_n(&comm->busy_fast, __ATOMIC_RELAXED) - 1, __ATOMIC_RELEASE);
}
/* Operations running on comm now (a membarrier first: see comm_busy_enter). */
int comm_busy_count(struct ncclComm* comm);
/* Waits (sleeping) until no operation runs on comm, at most `ms`; 1 if quiescent. */
int comm_wait_idle(struct ncclComm* comm, int ms);

#endif
