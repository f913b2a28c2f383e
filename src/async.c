/* Nonblocking communicators (config.blocking = 0 or NCCL_COMM_BLOCKING=0):
 * one worker thread per communicator runs its init, then the collectives and
 * groups queued by enqueue.c, in order. Calls return ncclInProgress at once;
 * ncclCommGetAsyncError reads ncclInProgress while anything is queued or
 * running. Blocking communicators never come here (no thread hop on their
 * path). Talks to init.c (start, stop) and enqueue.c (task lists). */
#include <errno.h>
#include <linux/membarrier.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "failures.h"
#include "futex.h"

struct async_job {
  struct async_job* next;
  struct task* list;
};

struct async_worker {
  struct ncclComm* comm;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct async_job *head, *tail;
  int pending; /* init + jobs queued or running */
  int quit, cancel;
  ncclResult_t (*init)(struct ncclComm*, void*);
  void* arg;
  void (*free_arg)(void*);
};

static void* worker_main(void* p) {
  struct async_worker* w = p;
  struct ncclComm* comm = w->comm;
  log_set_rank(comm->rank);
  ncclResult_t r = w->init(comm, w->arg);
  if (w->free_arg) w->free_arg(w->arg);
  if (r != ncclSuccess) {
    comm_set_error(comm, r, err_last_thread());
  } else {
    ncclResult_t cur = ncclInProgress;
    __atomic_compare_exchange_n(&comm->async_error, &cur, ncclSuccess, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  }
  pthread_mutex_lock(&w->mu);
  w->pending--;
  pthread_cond_broadcast(&w->cv);
  for (;;) {
    while (!w->head && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
    struct async_job* j = w->head;
    if (!j) break;
    w->head = j->next;
    if (!w->head) w->tail = NULL;
    int drop = w->cancel || __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) ||
               __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) || r != ncclSuccess;
    pthread_mutex_unlock(&w->mu);
    if (drop) {
      enqueue_free_list(j->list);
    } else {
      ncclResult_t jr = enqueue_run_list(j->list);
      /* Nobody is there to take a return code: every failure of queued work
       * is the communicator's (argument errors were caught at the call). */
      if (jr != ncclSuccess) comm_set_error(comm, jr, err_last_thread());
    }
    free(j);
    pthread_mutex_lock(&w->mu);
    w->pending--;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

ncclResult_t async_start(struct ncclComm* comm, ncclResult_t (*init)(struct ncclComm*, void*), void* arg,
                         void (*free_arg)(void*)) {
  struct async_worker* w = calloc(1, sizeof(*w));
  if (!w) return err_set(ncclSystemError, "out of memory for a nonblocking communicator's worker");
  w->comm = comm;
  w->init = init;
  w->arg = arg;
  w->free_arg = free_arg;
  w->pending = 1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  comm->async = w;
  int rc = pthread_create(&w->thread, NULL, worker_main, w);
  if (rc != 0) {
    comm->async = NULL;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return err_set(ncclSystemError, "cannot start a nonblocking communicator's worker: %s", strerror(rc));
  }
  return ncclSuccess;
}

void async_push(struct ncclComm* comm, struct task* list) {
  struct async_worker* w = comm->async;
  struct async_job* j = malloc(sizeof(*j));
  if (!j) {
    enqueue_free_list(list);
    comm_set_error(comm, ncclSystemError, "out of memory queueing nonblocking work");
    return;
  }
  j->next = NULL;
  j->list = list;
  pthread_mutex_lock(&w->mu);
  if (w->tail) w->tail->next = j;
  else w->head = j;
  w->tail = j;
  w->pending++;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int async_pending(struct ncclComm* comm) {
  struct async_worker* w = comm->async;
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  int p = w->pending;
  pthread_mutex_unlock(&w->mu);
  return p;
}

void async_drain(struct ncclComm* comm) {
  struct async_worker* w = comm->async;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  while (w->pending > 0) pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
}

void async_stop(struct ncclComm* comm, int cancel) {
  struct async_worker* w = comm->async;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->quit = 1;
  if (cancel) w->cancel = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  comm->async = NULL;
  /* Whatever was dropped unrun is freed here. */
  while (w->head) {
    struct async_job* j = w->head;
    w->head = j->next;
    enqueue_free_list(j->list);
    free(j);
  }
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

ncclResult_t async_make_blocking(struct ncclComm* comm) {
  if (!comm->nonblocking) return ncclSuccess;
  ncclResult_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  if (e != ncclSuccess || async_pending(comm))
    return err_set(ncclInvalidUsage, "comm %p rank %d: only an idle, healthy nonblocking communicator turns blocking",
                   (void*)comm, comm->rank);
  async_stop(comm, 0);
  comm->nonblocking = 0;
  comm->config.blocking = 1; /* split and shrink children inherit it */
  return ncclSuccess;
}

int comm_busy_fast_ok;

static void busy_register(void) {
  /* Refused on kernels before 4.14 and by some sandboxes: the locked counter then. */
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
    __atomic_store_n(&comm_busy_fast_ok, 1, __ATOMIC_RELEASE);
}

void comm_busy_setup(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, busy_register);
}

/* Makes every owner's busy_fast store that came before this call visible to
 * this thread's later loads (a full barrier on each CPU running one of the
 * process's threads; a thread not running was ordered by its switch out). */
static void busy_fence(void) {
  if (__atomic_load_n(&comm_busy_fast_ok, __ATOMIC_ACQUIRE))
    (void)syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int comm_busy_count(struct ncclComm* comm) {
  busy_fence();
  return (__atomic_load_n(&comm->busy, __ATOMIC_ACQUIRE) & ~COMM_BUSY_WAITER) +
         __atomic_load_n(&comm->busy_fast, __ATOMIC_ACQUIRE);
}

void comm_busy_exit(struct ncclComm* comm) {
  int* word = &comm->busy;
  /* After the decrement comm may be freed at once (abort waits for it): only
   * the address is used, by a futex wake, which reads no memory. A wake
   * that reaches some unrelated futex word is a spurious wake-up, which every
   * futex waiter tolerates. */
  if (__atomic_sub_fetch(word, 1, __ATOMIC_ACQ_REL) == COMM_BUSY_WAITER)
    futex_wake((uint32_t*)word, INT32_MAX, 0);
}

static struct timespec ms_to_ts(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  return ts;
}

int comm_wait_idle(struct ncclComm* comm, int ms) {
  int64_t end = time_ms() + ms;
  /* Running calls first: each ends at its next wait, woken by the stop fd
   * or a futex wake, and the last one out of the locked counter wakes us
   * (comm_busy_exit); the owner's plain count is polled, from 20 us up to
   * 1 ms apart. */
  /* Announce a waiter first: from then on the last one out wakes us. */
  __atomic_fetch_or(&comm->busy, COMM_BUSY_WAITER, __ATOMIC_ACQ_REL);
  busy_fence();
  long nap_us = 20;
  for (;;) {
    int b = __atomic_load_n(&comm->busy, __ATOMIC_ACQUIRE);
    int f = __atomic_load_n(&comm->busy_fast, __ATOMIC_ACQUIRE);
    if ((b & ~COMM_BUSY_WAITER) == 0 && f == 0) break;
    int64_t left = end - time_ms();
    if (left <= 0) return 0;
    if (f == 0) {
      futex_wait((uint32_t*)&comm->busy, (uint32_t)b, (int)COLLIE_MIN(left, 1 << 30), 0);
      continue;
    }
    struct timespec ts = {0, nap_us * 1000L};
    nanosleep(&ts, NULL);
    if (nap_us < 1000) nap_us *= 2;
  }
  /* Then the nonblocking worker's queue (its cv is signalled per job). */
  struct async_worker* w = comm->async;
  if (!w) return 1;
  pthread_mutex_lock(&w->mu);
  while (w->pending > 0) {
    int64_t left = end - time_ms();
    if (left <= 0) break;
    struct timespec now, abs;
    clock_gettime(CLOCK_REALTIME, &now);
    abs = ms_to_ts(left);
    abs.tv_sec += now.tv_sec;
    abs.tv_nsec += now.tv_nsec;
    if (abs.tv_nsec >= 1000000000L) {
      abs.tv_sec++;
      abs.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&w->cv, &w->mu, &abs);
  }
  int idle = w->pending == 0;
  pthread_mutex_unlock(&w->mu);
  return idle && comm_busy_count(comm) == 0;
}
