/* Channels: a ring collective split into nch parts, each moved by its own
 * ring of connectors. Channel 0 runs on the calling thread; channels 1..nch-1
 * run on helper threads that belong to the communicator, created on first
 * use and pinned (hwloc, else sched_setaffinity) to distinct CPUs of the
 * process where the machine has a CPU for each (pin_fits). Connectors of
 * every channel are set up on the calling thread first, in the same order on
 * every rank, because setup talks through the bootstrap. Each channel
 * progresses only its own connectors. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../graph/topo.h"
#include "coll.h"

struct ch_task {
  struct coll_args a;
  int ch;
  size_t off, len; /* elements (bytes for allgather) of this channel's part */
  ncclResult_t res;
  char err[512];
};

struct ch_worker {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct ch_task* task; /* set by the caller, cleared by the worker when done */
  int quit;
  int index;
  struct ncclComm* comm;
};

struct ch_pool {
  int n;
  struct ch_worker w[MAX_CHANNELS - 1];
};

static ncclResult_t run_part_algo(struct ch_task* t) {
  struct coll_args* a = &t->a;
  struct ncclComm* comm = a->comm;
  struct ring_view v = ring_full(comm);
  v.ch = t->ch;
  size_t esz = dtype_size(a->dt);
  struct coll_args sub = *a;
  sub.count = t->len;
  sub.sendbuff = a->sendbuff ? (const char*)a->sendbuff + t->off * esz : NULL;
  sub.recvbuff = a->recvbuff ? (char*)a->recvbuff + t->off * esz : NULL;
  switch (a->kind) {
    case COLL_ALLREDUCE:
      return ring_allreduce_view(&sub, &v, sub.sendbuff, sub.recvbuff, &sub.op, a->avg ? comm->nranks : 0);
    case COLL_BROADCAST: return ring_broadcast_view(&sub, &v, comm->ring_pos[a->root], sub.sendbuff, sub.recvbuff);
    case COLL_REDUCE:
      return ring_reduce_view(&sub, &v, comm->ring_pos[a->root], sub.sendbuff, sub.recvbuff, a->avg ? comm->nranks : 0);
    case COLL_ALLGATHER: return ring_allgather_view(a, &v, t->off * esz, t->len * esz);
    case COLL_REDUCESCATTER: return ring_reducescatter_view(a, &v, t->off, t->len);
    default: return err_set(ncclInternalError, "%s has no channel split", coll_name(a->kind));
  }
}

/* A part ends when its bytes have left this process (transport_flush_ch):
 * nobody else progresses this channel's connectors until the next call, and
 * a peer may be waiting for them to finish its own part. */
static ncclResult_t run_part(struct ch_task* t) {
  ncclResult_t res = run_part_algo(t);
  if (res == ncclSuccess) res = transport_flush_ch(t->a.comm, t->ch);
  return res;
}

/* Whether the helper of channel ch (1..) gets a CPU of its own: only where
 * the helpers of channels 1..ch of every rank on this machine fit on its
 * CPUs one each. Beyond that a pin only takes the scheduler's choice away:
 * 4 unbound ranks over sockets on 2 CPUs (NCCL_HOSTID), helpers pinned 2 to
 * a CPU beside one busy process, took 2x as long for an allgather of 32-128
 * MiB as with the helpers free (docs/ARCHITECTURE.md, Channels). */
static int pin_fits(const struct ncclComm* comm, int ch) {
  return (long)comm->machine_size * ch <= comm->machine_cpus;
}

static void* worker_main(void* p) {
  struct ch_worker* w = p;
  struct ncclComm* comm = w->comm;
  log_set_rank(comm->rank);
  int ch = w->index + 1;
  if (pin_fits(comm, ch)) {
    /* Spread the helpers of the ranks on this machine over its CPUs: by the
     * rank's place among the machine's ranks, which NCCL_HOSTID may have
     * split into hosts (local_rank 0 on each, all helpers on one CPU).
     * Channel by channel, so the first machine_size x ch places, all
     * distinct, are what channels 1..ch take. */
    int where = topo_bind_thread((ch - 1) * comm->machine_size + comm->machine_rank);
    INFO(LOG_INIT, "channel helper %d of rank %d bound to CPU %d", ch, comm->rank, where);
  } else {
    INFO(LOG_INIT, "channel helper %d of rank %d left on the process's CPUs: %d ranks on this machine, %d CPUs", ch,
         comm->rank, comm->machine_size, comm->machine_cpus);
  }
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->task && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->task) break;
    struct ch_task* t = w->task;
    pthread_mutex_unlock(&w->mu);
    t->res = run_part(t);
    if (t->res != ncclSuccess) snprintf(t->err, sizeof(t->err), "%s", err_last_thread());
    pthread_mutex_lock(&w->mu);
    w->task = NULL;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static ncclResult_t ensure_pool(struct ncclComm* comm, int nworkers) {
  if (!comm->chpool) {
    comm->chpool = calloc(1, sizeof(struct ch_pool));
    if (!comm->chpool) return err_set(ncclSystemError, "out of memory for channel helpers");
  }
  struct ch_pool* pool = comm->chpool;
  while (pool->n < nworkers) {
    struct ch_worker* w = &pool->w[pool->n];
    memset(w, 0, sizeof(*w));
    w->index = pool->n;
    w->comm = comm;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc != 0) {
      pthread_mutex_destroy(&w->mu);
      pthread_cond_destroy(&w->cv);
      return err_set(ncclSystemError, "cannot start a channel helper thread: %s", strerror(rc));
    }
    pool->n++;
  }
  return ncclSuccess;
}

void channels_free(struct ncclComm* comm) {
  struct ch_pool* pool = comm->chpool;
  if (!pool) return;
  for (int i = 0; i < pool->n; i++) {
    struct ch_worker* w = &pool->w[i];
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
  }
  free(pool);
  comm->chpool = NULL;
}

ncclResult_t channels_run(struct coll_args* a, int nch) {
  struct ncclComm* comm = a->comm;
  if (nch > MAX_CHANNELS) nch = MAX_CHANNELS;
  struct ring_view v = ring_full(comm);
  int next = v.ranks[(v.pos + 1) % v.n], prev = v.ranks[(v.pos + v.n - 1) % v.n];
  for (int c = 0; c < nch; c++) {
    struct conn *sc, *rc;
    NCCLCHECK(transport_connect_ch(comm, c, &next, 1, &prev, 1, &sc, &rc));
  }
  NCCLCHECK(ensure_pool(comm, nch - 1));
  struct ch_task tasks[MAX_CHANNELS];
  size_t total = a->count;
  for (int c = 0; c < nch; c++) {
    size_t lo = total * (size_t)c / (size_t)nch, hi = total * (size_t)(c + 1) / (size_t)nch;
    tasks[c] = (struct ch_task){.a = *a, .ch = c, .off = lo, .len = hi - lo, .res = ncclSuccess};
  }
  struct ch_pool* pool = comm->chpool;
  for (int c = 1; c < nch; c++) {
    struct ch_worker* w = &pool->w[c - 1];
    pthread_mutex_lock(&w->mu);
    w->task = &tasks[c];
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
  }
  tasks[0].res = run_part(&tasks[0]);
  ncclResult_t res = tasks[0].res;
  for (int c = 1; c < nch; c++) {
    struct ch_worker* w = &pool->w[c - 1];
    pthread_mutex_lock(&w->mu);
    while (w->task) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    if (res == ncclSuccess && tasks[c].res != ncclSuccess) res = err_set(tasks[c].res, "channel %d: %s", c, tasks[c].err);
  }
  if (res != ncclSuccess) transport_poison(comm);
  return res;
}
