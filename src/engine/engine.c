/* The engine's background thread: every cycle it takes newly submitted
 * requests and runs one round per process set it belongs to (world first):
 * negotiate.c agrees with the other members on what runs (coordinator.c
 * answers on the set's rank 0), execute.c runs it, fusing allreduces. Only
 * this thread uses the engine's communicators. See docs/ARCHITECTURE.md,
 * section Engine. api.c submits; util.c, timeline.c and autotune.c are parts. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Nonblocking communicators may answer ncclInProgress: wait for the outcome
 * (sleeping between polls). */
ncclResult_t engine_settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    ncclResult_t a;
    if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return ncclInternalError;
    if (a != ncclInProgress) return a;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  return r;
}

/* ------------------------------------------------------------ request lists */

static void pend_unlink(struct pset* s, struct req* r) {
  if (r->prev) r->prev->next = r->next;
  else s->head = r->next;
  if (r->next) r->next->prev = r->prev;
  else s->tail = r->prev;
  r->next = r->prev = NULL;
  map_del(&s->pend, r->m.name);
}

static void pend_append(struct pset* s, struct req* r) {
  r->next = NULL;
  r->prev = s->tail;
  if (s->tail) s->tail->next = r;
  else s->head = r;
  s->tail = r;
}

/* Completes a request with a status and frees it. */
void engine_finish(struct engine* e, struct pset* s, struct req* r, int status, const char* err, void* result,
                   size_t result_count, size_t* counts, int ncounts, int64_t value) {
  pend_unlink(s, r);
  engine_inflight_del(e, r->set, r->m.name);
  e->stats.tensors++;
  engine_complete(e, r->handle, status, err, result, result_count, counts, ncounts, value);
  req_free(r);
}

static struct pset* find_set(struct engine* e, int id) {
  for (struct pset* s = e->sets; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

/* Frees a process set's engine state (not the list link). */
void engine_pset_free(struct pset* s) {
  while (s->head) {
    struct req* r = s->head;
    pend_unlink(s, r);
    req_free(r);
  }
  map_free(&s->pend);
  while (s->fhead) {
    struct pentry* p = s->fhead;
    s->fhead = p->next;
    engine_pentry_free(p, s->size);
  }
  map_free(&s->table);
  cache_fini(&s->cache);
  free(s->ranks);
  free(s->joined);
  free(s->joined_round);
  free(s);
}

/* ------------------------------------------------------------ one round of a set */

/* Every rank has joined: the join completes everywhere with the last rank to join. */
static void join_complete(struct engine* e, struct pset* s) {
  int n = s->size, last = 0;
  for (int r = 1; r < n; r++)
    if (s->joined_round[r] >= s->joined_round[last]) last = r;
  for (int r = 0; r < n; r++) s->joined[r] = 0;
  e->joined_me = 0;
  pthread_mutex_lock(&e->lock);
  int h = e->join_handle;
  e->join_handle = -1;
  pthread_mutex_unlock(&e->lock);
  if (h >= 0) engine_complete(e, h, 0, NULL, NULL, 0, NULL, 0, last);
}

static ncclResult_t set_round(struct engine* e, struct pset* s, int* shutdown) {
  struct joblist jl = {0};
  struct agreement ag;
  int64_t now = time_ns();
  ncclResult_t res = engine_negotiate(e, s, now, &jl, &ag);
  *shutdown = ag.shutdown;
  if (res == ncclSuccess) {
    int64_t agreed = time_ns();
    e->stats.negotiate_ns += (uint64_t)(agreed - now);
    res = engine_execute(e, s, jl.jobs, jl.n, agreed);
  }
  if (res == ncclSuccess && ag.all_joined) join_complete(e, s);
  engine_joblist_free(&jl);
  return res;
}

/* ------------------------------------------------------------ the thread */

/* Moves submitted requests to their sets (requests of removed sets fail). */
static void take_incoming(struct engine* e) {
  pthread_mutex_lock(&e->lock);
  struct req* list = e->in_head;
  e->in_head = e->in_tail = NULL;
  if (e->join_handle >= 0) e->joined_me = 1;
  pthread_mutex_unlock(&e->lock);
  int64_t now = time_ns();
  while (list) {
    struct req* r = list;
    list = r->next;
    r->next = r->prev = NULL;
    r->t_enq = now;
    struct pset* s = find_set(e, r->set);
    if (!s || s->rank < 0 || map_put(&s->pend, r->m.name, r) != 0) {
      engine_inflight_del(e, r->set, r->m.name);
      engine_complete(e, r->handle, COLLIE_ERR_INVALID_ARGUMENT,
                      s ? "collie: out of memory" : "collie: the process set was removed", NULL, 0, NULL, 0, 0);
      req_free(r);
      continue;
    }
    pend_append(s, r);
  }
}

static void fail_all(struct engine* e, int status, const char* why) {
  take_incoming(e);
  for (struct pset* s = e->sets; s; s = s->next)
    while (s->head) engine_finish(e, s, s->head, status, why, NULL, 0, NULL, 0, 0);
  pthread_mutex_lock(&e->lock);
  int h = e->join_handle;
  e->join_handle = -1;
  pthread_mutex_unlock(&e->lock);
  if (h >= 0) engine_complete(e, h, status, why, NULL, 0, NULL, 0, -1);
}

static void* engine_main(void* arg) {
  struct engine* e = arg;
  log_set_rank(e->rank);
  int64_t next = time_ns();
  ncclResult_t res = ncclSuccess;
  int shutdown = 0;
  while (!shutdown) {
    pthread_mutex_lock(&e->lock);
    while (!e->stop_requested && time_ns() < next) {
      struct timespec ts = {(time_t)(next / 1000000000LL), (long)(next % 1000000000LL)};
      pthread_cond_timedwait(&e->wake, &e->lock, &ts);
    }
    pthread_mutex_unlock(&e->lock);
    int64_t start = time_ns();
    next = start + e->cycle_us * 1000;
    e->stats.cycles++;
    timeline_cycle(&e->tl, start);
    take_incoming(e);
    e->cycle_bytes = 0;
    for (struct pset* s = e->sets; s && res == ncclSuccess; s = s->next) {
      if (s->rank < 0) continue;
      int sd = 0;
      res = set_round(e, s, &sd);
      if (s->id == 0 && sd) {
        shutdown = 1;
        break; /* every rank saw the same world vector: all stop here */
      }
    }
    if (res != ncclSuccess) break;
    if (e->rank == 0 && e->at.on) autotune_cycle(&e->at, time_ns(), e->cycle_bytes);
  }
  char why[1200];
  int status;
  if (res != ncclSuccess) {
    status = COLLIE_ERR_COMMUNICATION;
    snprintf(why, sizeof(why), "collie: the engine stopped after a communication failure: %s", err_last_thread());
  } else {
    status = COLLIE_ERR_SHUTDOWN;
    snprintf(why, sizeof(why), "collie: the engine was shut down (collie_shutdown on some rank)");
  }
  pthread_mutex_lock(&e->lock);
  e->running = 0;
  e->failed_status = status;
  snprintf(e->stop_reason, sizeof(e->stop_reason), "%s", why);
  pthread_mutex_unlock(&e->lock);
  fail_all(e, status, why);
  pthread_mutex_lock(&e->lock);
  pthread_cond_broadcast(&e->done_cond);
  pthread_mutex_unlock(&e->lock);
  return NULL;
}

int engine_start_thread(struct engine* e) {
  e->running = 1;
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    e->running = 0;
    return -1;
  }
  return 0;
}
