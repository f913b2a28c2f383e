/* The engine's public API (include/collie.h): init / shutdown, argument
 * checks, the handle table and submission to the background thread
 * (engine.c). All state is in engine_g under one mutex; collie_wait sleeps on
 * a condition variable that the background thread signals. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"
#include "engine/engine.h"

struct engine engine_g;

/* Never destroyed: a thread still waking up in collie_wait after
 * collie_shutdown must find valid synchronisation objects. */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t sync_once = PTHREAD_ONCE_INIT;

static void sync_init(void) {
  pthread_mutex_init(&engine_g.lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&engine_g.done_cond, &ca);
  pthread_cond_init(&engine_g.wake, &ca);
  pthread_condattr_destroy(&ca);
  timeline_init(&engine_g.tl);
}

/* ------------------------------------------------------------ errors */

static __thread char last_error[1400];

COLLIE_EXPORT const char* collie_last_error(void) { return last_error; }

/* Lets the elastic layer (src/elastic) report through collie_last_error(). */
void engine_last_error_set(const char* msg) { snprintf(last_error, sizeof(last_error), "%s", msg ? msg : ""); }

static int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
  INFO(LOG_COLL, "%s", last_error);
  return code;
}

/* ------------------------------------------------------------ handles (lock held) */

/* Handle ids only grow (wrapping at INT_MAX, skipping ids still in use), so
 * a stale id never names a later operation. Slots are reused; an
 * open-addressing table (linear probing, backward-shift deletion) maps ids
 * to slots. */
static size_t hidx_home(const struct engine* e, int id) { return ((uint32_t)id * 2654435761u) & (e->hidx_cap - 1); }

static int hidx_find(const struct engine* e, int id) {
  if (!e->hidx_cap || id < 0) return -1;
  for (size_t i = hidx_home(e, id);; i = (i + 1) & (e->hidx_cap - 1)) {
    int slot = e->hidx[i];
    if (slot < 0) return -1;
    if (e->handles[slot].id == id) return (int)i;
  }
}

static void hidx_insert(struct engine* e, int id, int slot) {
  size_t i = hidx_home(e, id);
  while (e->hidx[i] >= 0) i = (i + 1) & (e->hidx_cap - 1);
  e->hidx[i] = slot;
}

static void hidx_remove(struct engine* e, size_t i) {
  size_t mask = e->hidx_cap - 1;
  e->hidx[i] = -1;
  /* Moves later entries of the probe run back so lookups never stop early. */
  for (size_t j = (i + 1) & mask; e->hidx[j] >= 0; j = (j + 1) & mask) {
    size_t home = hidx_home(e, e->handles[e->hidx[j]].id);
    int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (between) continue;
    e->hidx[i] = e->hidx[j];
    e->hidx[j] = -1;
    i = j;
  }
}

static int handle_new(struct engine* e, int parts) {
  int slot = -1;
  for (int i = 0; i < e->nhandles && slot < 0; i++) {
    int k = (e->handle_hint + i) % e->nhandles;
    if (!e->handles[k].used) slot = k;
  }
  if (slot < 0) {
    int n = e->nhandles ? e->nhandles * 2 : 64;
    if (n > (1 << 28)) return -1;
    /* The index stays at most half full. */
    size_t cap = (size_t)n * 2;
    int* idx = malloc(sizeof(int) * cap);
    if (!idx) return -1;
    struct handle* h = realloc(e->handles, sizeof(*h) * (size_t)n);
    if (!h) {
      free(idx);
      return -1;
    }
    memset(h + e->nhandles, 0, sizeof(*h) * (size_t)(n - e->nhandles));
    e->handles = h;
    free(e->hidx);
    e->hidx = idx;
    e->hidx_cap = cap;
    for (size_t i = 0; i < cap; i++) e->hidx[i] = -1;
    for (int k = 0; k < e->nhandles; k++)
      if (e->handles[k].used) hidx_insert(e, e->handles[k].id, k);
    slot = e->nhandles;
    e->nhandles = n;
  }
  int id = e->next_handle_id;
  while (hidx_find(e, id) >= 0) id = id == INT_MAX ? 0 : id + 1;
  e->next_handle_id = id == INT_MAX ? 0 : id + 1;
  e->handle_hint = slot + 1;
  e->handles[slot] = (struct handle){.used = 1, .id = id, .parts = parts};
  hidx_insert(e, id, slot);
  return id;
}

static struct handle* handle_lookup(struct engine* e, int id) {
  int i = hidx_find(e, id);
  return i < 0 ? NULL : &e->handles[e->hidx[i]];
}

static void handle_clear(struct handle* h) {
  free(h->err);
  free(h->result);
  free(h->counts);
  memset(h, 0, sizeof(*h));
}

/* Frees a handle and forgets its id. */
static void handle_drop(struct engine* e, int id) {
  int i = hidx_find(e, id);
  if (i < 0) return;
  struct handle* h = &e->handles[e->hidx[i]];
  hidx_remove(e, (size_t)i);
  handle_clear(h);
}

static struct handle* handle_get(struct engine* e, int id) {
  if (!e->initialized) return NULL;
  return handle_lookup(e, id);
}

void engine_complete(struct engine* e, int id, int status, const char* err, void* result, size_t result_count,
                     size_t* counts, int ncounts, int64_t value) {
  pthread_mutex_lock(&e->lock);
  struct handle* h = handle_lookup(e, id);
  if (!h) {
    pthread_mutex_unlock(&e->lock);
    free(result);
    free(counts);
    return;
  }
  if (status != 0 && h->status == 0) {
    h->status = status;
    free(h->err);
    h->err = strdup(err ? err : "collie: failed");
  }
  if (result && !h->result) {
    h->result = result;
    h->result_count = result_count;
    result = NULL;
  }
  if (counts && !h->counts) {
    h->counts = counts;
    h->ncounts = ncounts;
    counts = NULL;
  }
  h->value = value;
  if (--h->parts <= 0) {
    h->done = 1;
    pthread_cond_broadcast(&e->done_cond);
  }
  pthread_mutex_unlock(&e->lock);
  free(result);
  free(counts);
}

static void inflight_key(char* key, size_t cap, int set, const char* name) { snprintf(key, cap, "%d/%s", set, name); }

void engine_inflight_del(struct engine* e, int set, const char* name) {
  char key[1100];
  inflight_key(key, sizeof(key), set, name);
  pthread_mutex_lock(&e->lock);
  map_del(&e->inflight, key);
  pthread_mutex_unlock(&e->lock);
}

/* ------------------------------------------------------------ init / shutdown */

static int parse_seconds(enum param_id id, double def, double lo, double hi, double* out) {
  const char* v = param_str(id);
  *out = def;
  if (!v) return 0;
  char* end;
  double x = strtod(v, &end);
  while (*end == ' ') end++;
  if (end == v || *end || !(x >= lo && x <= hi)) {
    WARN("%s=\"%s\" is not a number in [%g, %g]; using %g", param_table[id].name, v, lo, hi, def);
    return 0;
  }
  *out = x;
  return param_str(id) != param_table[id].def;
}

/* Values from the environment at init; world rank 0's are broadcast so every rank fuses and caches alike. */
struct agreed_cfg {
  int64_t cycle_us, fusion, cache_cap, stall_check_ns, stall_shutdown_ns, fusion_inplace;
};

static void local_ranks(struct engine* e) {
  e->local_rank = 0;
  e->local_size = 1;
  e->cross_rank = 0;
  e->cross_size = 1;
  uint64_t* hosts = calloc((size_t)e->size, sizeof(uint64_t));
  if (!hosts) return;
  int nh = 0, mine = 0;
  for (int r = 0; r < e->size; r++) {
    collie_peer_info_t pi;
    memset(&pi, 0, sizeof(pi));
    pi.size = sizeof(pi);
    if (collie_comm_peer_info(e->world, r, &pi) != ncclSuccess) continue;
    int k = 0;
    while (k < nh && hosts[k] != pi.host_hash) k++;
    if (k == nh) hosts[nh++] = pi.host_hash;
    if (r == e->rank) {
      mine = k;
      e->local_rank = pi.local_rank;
      e->local_size = pi.local_size;
    }
  }
  e->cross_rank = mine;
  e->cross_size = nh > 0 ? nh : 1;
  free(hosts);
}

static void engine_teardown(struct engine* e, int abort_comms);

/* The caller holds init_lock and has checked that no engine is initialised. */
static int engine_init(ncclComm_t comm, int owns) {
  struct engine* e = &engine_g;
  pthread_mutex_lock(&e->lock);
  e->world = comm;
  e->owns_world = owns;
  e->join_handle = -1;
  e->joined_me = 0;
  e->next_set_id = 1;
  e->setop_seq = 0;
  e->stop_requested = 0;
  e->failed_status = 0;
  e->stop_reason[0] = '\0';
  memset(&e->stats, 0, sizeof(e->stats));
  pthread_mutex_unlock(&e->lock);
  int rc = COLLIE_ERR_INTERNAL;
  if (ncclCommUserRank(comm, &e->rank) != ncclSuccess || ncclCommCount(comm, &e->size) != ncclSuccess) {
    rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_init_comm: invalid communicator: %s", ncclGetLastError(NULL));
    goto fail_early;
  }
  local_ranks(e);

  double cycle_ms, check_s, shut_s;
  int cycle_explicit = parse_seconds(P_COLLIE_CYCLE_TIME, 1.0, 0.01, 10000.0, &cycle_ms);
  parse_seconds(P_COLLIE_STALL_CHECK_TIME_SECONDS, 60.0, 0.0, 1e7, &check_s);
  parse_seconds(P_COLLIE_STALL_SHUTDOWN_TIME_SECONDS, 0.0, 0.0, 1e7, &shut_s);
  int fusion_explicit = param_str(P_COLLIE_FUSION_THRESHOLD) != param_table[P_COLLIE_FUSION_THRESHOLD].def;
  struct agreed_cfg cfg = {
      .cycle_us = (int64_t)(cycle_ms * 1000.0 + 0.5),
      .fusion = param_int(P_COLLIE_FUSION_THRESHOLD, 0, (int64_t)1 << 40),
      .cache_cap = param_int(P_COLLIE_CACHE_CAPACITY, 0, 1 << 20),
      .stall_check_ns = (int64_t)(check_s * 1e9),
      .stall_shutdown_ns = (int64_t)(shut_s * 1e9),
      .fusion_inplace = param_int(P_COLLIE_FUSION_INPLACE_BYTES, 0, (int64_t)1 << 40),
  };
  if (cfg.cycle_us < 10) cfg.cycle_us = 10;
  int autotune = param_int(P_COLLIE_AUTOTUNE, 0, 1) == 1;
  const char* at_log = param_str(P_COLLIE_AUTOTUNE_LOG);
  const char* tl_path = param_str(P_COLLIE_TIMELINE);
  int tl_marks = param_int(P_COLLIE_TIMELINE_MARK_CYCLES, 0, 1) == 1;
  e->peer_timeout_s = param_int(P_COLLIE_PEER_TIMEOUT, 0, 1 << 20);
  /* Also the first collective of the engine: every rank has arrived. */
  ncclResult_t r =
      engine_settle(comm, ncclBroadcast(&cfg, &cfg, sizeof(cfg) / sizeof(int64_t), ncclInt64, 0, comm, NULL));
  if (r != ncclSuccess) {
    rc = fail(COLLIE_ERR_COMMUNICATION, "collie_init: agreeing on the engine settings failed: %s",
              ncclGetLastError(NULL));
    goto fail_early;
  }
  e->cycle_us = cfg.cycle_us;
  e->fusion = cfg.fusion;
  e->cache_cap = (int)cfg.cache_cap;
  e->stall_check_ns = cfg.stall_check_ns;
  e->stall_shutdown_ns = cfg.stall_shutdown_ns;
  e->fusion_inplace = cfg.fusion_inplace;

  struct pset* w = calloc(1, sizeof(*w));
  if (!w) goto oom;
  w->ranks = malloc(sizeof(int) * (size_t)e->size);
  w->joined = calloc((size_t)e->size, 1);
  w->joined_round = calloc((size_t)e->size, sizeof(int64_t));
  if (!w->ranks || !w->joined || !w->joined_round || cache_init(&w->cache, e->cache_cap) != 0) {
    engine_pset_free(w);
    goto oom;
  }
  for (int i = 0; i < e->size; i++) w->ranks[i] = i;
  w->id = COLLIE_WORLD;
  w->size = e->size;
  w->rank = e->rank;
  w->comm = comm;
  e->sets = w;
  autotune_init(&e->at, e->rank == 0 && autotune, !fusion_explicit, !cycle_explicit, e->fusion, e->cycle_us, at_log);
  if (e->rank == 0 && tl_path && timeline_start(&e->tl, tl_path, tl_marks) != 0)
    WARN("COLLIE_TIMELINE=%s: cannot open it; no timeline", tl_path);

  pthread_mutex_lock(&e->lock);
  e->initialized = 1;
  pthread_mutex_unlock(&e->lock);
  if (engine_start_thread(e) != 0) {
    engine_teardown(e, 0);
    return fail(COLLIE_ERR_INTERNAL, "collie_init: cannot start the engine thread");
  }
  INFO(LOG_INIT, "collie engine: rank %d of %d, cycle %.3f ms, fusion %lld bytes, cache %d, autotune %d", e->rank,
       e->size, (double)e->cycle_us / 1000.0, (long long)e->fusion, e->cache_cap, e->at.on);
  return 0;
oom:
  rc = fail(COLLIE_ERR_INTERNAL, "collie_init: out of memory");
fail_early:
  if (owns) ncclCommDestroy(comm);
  e->world = NULL;
  return rc;
}

/* Init over an engine this process still holds is refused before anything
 * collective happens. The engine stays held after a peer's shutdown has
 * stopped it, until this process calls collie_shutdown: whether a peer's
 * shutdown has reached this rank yet differs from rank to rank, but this
 * check depends on the process's own calls only. (collie_init used to build
 * its world communicator first: its bootstrap, with the job's one root
 * address, then met a peer's genuine next init, and that peer's engine was
 * left with a communicator this rank destroyed.) Lock: init_lock. */
static int refuse_if_held(const char* fn) {
  if (!engine_g.initialized) return 0;
  pthread_mutex_lock(&engine_g.lock);
  int running = engine_g.running;
  pthread_mutex_unlock(&engine_g.lock);
  return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: the engine is already initialised%s (call collie_shutdown first)", fn,
              running ? "" : " and was stopped by a shutdown");
}

COLLIE_EXPORT int collie_init(void) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&init_lock);
  int rc = refuse_if_held("collie_init");
  if (rc == 0) {
    ncclComm_t comm = NULL;
    ncclResult_t r = collie_comm_init_from_env(&comm);
    if (r != ncclSuccess)
      rc = fail(r == ncclInvalidUsage || r == ncclInvalidArgument ? COLLIE_ERR_INVALID_ARGUMENT
                                                                  : COLLIE_ERR_COMMUNICATION,
                "collie_init: %s", ncclGetLastError(NULL));
    else
      rc = engine_init(comm, 1);
  }
  pthread_mutex_unlock(&init_lock);
  return rc;
}

COLLIE_EXPORT int collie_init_comm(ncclComm_t comm) {
  if (comm == NULL) return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_init_comm: comm is NULL");
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&init_lock);
  int rc = refuse_if_held("collie_init_comm");
  if (rc == 0) rc = engine_init(comm, 0);
  pthread_mutex_unlock(&init_lock);
  return rc;
}

/* Frees everything after the thread has stopped (or never started). */
static void engine_teardown(struct engine* e, int abort_comms) {
  pthread_mutex_lock(&e->lock);
  struct pset* sets = e->sets;
  e->sets = NULL;
  struct req* in = e->in_head;
  e->in_head = e->in_tail = NULL;
  for (int i = 0; i < e->nhandles; i++) handle_clear(&e->handles[i]);
  free(e->handles);
  e->handles = NULL;
  e->nhandles = e->handle_hint = 0;
  free(e->hidx);
  e->hidx = NULL;
  e->hidx_cap = 0; /* next_handle_id carries on: ids stay unique across init cycles */
  map_free(&e->inflight);
  e->initialized = 0;
  e->running = 0;
  pthread_cond_broadcast(&e->done_cond);
  pthread_mutex_unlock(&e->lock);
  while (in) {
    struct req* n = in->next;
    req_free(in);
    in = n;
  }
  while (sets) {
    struct pset* n = sets->next;
    if (sets->id != COLLIE_WORLD && sets->comm) {
      if (abort_comms) ncclCommAbort(sets->comm);
      else ncclCommDestroy(sets->comm);
    }
    engine_pset_free(sets);
    sets = n;
  }
  if (e->owns_world && e->world) {
    if (abort_comms) ncclCommAbort(e->world);
    else ncclCommDestroy(e->world);
  }
  e->world = NULL;
  timeline_stop(&e->tl);
  autotune_fini(&e->at);
  free(e->vec);
  e->vec = NULL;
  e->vec_cap = 0;
  free(e->fusion_buf);
  e->fusion_buf = NULL;
  e->fusion_cap = 0;
}

COLLIE_EXPORT int collie_shutdown(void) {
  pthread_once(&sync_once, sync_init);
  struct engine* e = &engine_g;
  pthread_mutex_lock(&init_lock);
  if (!e->initialized) {
    pthread_mutex_unlock(&init_lock);
    return 0;
  }
  pthread_mutex_lock(&e->lock);
  e->stop_requested = 1;
  pthread_cond_broadcast(&e->wake);
  /* Other ranks stop within a cycle of seeing the request; a peer that is
   * gone is detected by the communicator (COLLIE_PEER_TIMEOUT). Past that,
   * abort the communicators so the thread's waits return. */
  int64_t limit = time_ns() + (e->peer_timeout_s + 20) * 1000000000LL;
  int aborted = 0;
  while (e->running) {
    if (time_ns() > limit && !aborted) {
      WARN("collie_shutdown: the engine thread did not stop in time; aborting its communicators");
      for (struct pset* s = e->sets; s; s = s->next)
        if (s->comm) __atomic_store_n(&s->comm->abort_flag, 1, __ATOMIC_RELEASE);
      aborted = 1;
    }
    int64_t t = time_ns() + 100000000LL;
    struct timespec ts = {(time_t)(t / 1000000000LL), (long)(t % 1000000000LL)};
    pthread_cond_timedwait(&e->done_cond, &e->lock, &ts);
  }
  int broken = aborted || e->failed_status == COLLIE_ERR_COMMUNICATION;
  pthread_mutex_unlock(&e->lock);
  pthread_join(e->thread, NULL);
  engine_teardown(e, broken);
  pthread_mutex_unlock(&init_lock);
  return 0;
}

COLLIE_EXPORT int collie_is_initialized(void) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  int v = engine_g.initialized && engine_g.running;
  pthread_mutex_unlock(&engine_g.lock);
  return v;
}

#define QUERY(fn, field)                                                                         \
  COLLIE_EXPORT int fn(void) {                                                                   \
    pthread_once(&sync_once, sync_init);                                                         \
    pthread_mutex_lock(&engine_g.lock);                                                          \
    int v = engine_g.initialized ? engine_g.field : COLLIE_ERR_NOT_INITIALIZED;                  \
    pthread_mutex_unlock(&engine_g.lock);                                                        \
    if (v < 0) fail(COLLIE_ERR_NOT_INITIALIZED, "%s: the engine is not initialised", #fn);       \
    return v;                                                                                    \
  }
QUERY(collie_rank, rank)
QUERY(collie_size, size)
QUERY(collie_local_rank, local_rank)
QUERY(collie_local_size, local_size)
QUERY(collie_cross_rank, cross_rank)
QUERY(collie_cross_size, cross_size)

/* ------------------------------------------------------------ submission */

#define NAME_MAX_LEN 1000

static int check_running(struct engine* e, const char* fn) {
  if (!e->initialized) return fail(COLLIE_ERR_NOT_INITIALIZED, "%s: the engine is not initialised", fn);
  if (!e->running)
    return fail(e->failed_status ? e->failed_status : COLLIE_ERR_SHUTDOWN, "%s: %s", fn,
                e->stop_reason[0] ? e->stop_reason : "the engine has stopped");
  return 0;
}

/* Lock held. */
static struct pset* set_of(struct engine* e, int id, const char* fn, int* rc) {
  struct pset* s = e->sets;
  while (s && s->id != id) s = s->next;
  if (!s) *rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: no process set %d", fn, id);
  else if (s->rank < 0) *rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: this rank is not a member of process set %d", fn, id);
  return s && s->rank >= 0 ? s : NULL;
}

/* Queues n prepared requests under one handle. Takes ownership of reqs[i]. */
static int submit(struct req** reqs, int n, int set, const char* fn) {
  pthread_once(&sync_once, sync_init);
  struct engine* e = &engine_g;
  int rc = 0, h = -1;
  pthread_mutex_lock(&e->lock);
  if ((rc = check_running(e, fn)) != 0) goto out;
  struct pset* s = set_of(e, set, fn, &rc);
  if (!s) goto out;
  for (int i = 0; i < n; i++) {
    struct meta* m = &reqs[i]->m;
    if (!m->name) {
      char nm[64];
      snprintf(nm, sizeof(nm), "collie.noname.%s.%llu", engine_kind_name(m->kind), (unsigned long long)s->noname_seq++);
      m->name = strdup(nm);
      if (!m->name) {
        rc = fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
        goto out;
      }
    }
    /* The members of a grouped allreduce carry its key (the first member's
     * name, unique while pending) and size: the coordinator and the cache
     * release them together. */
    if (n > 1 && i > 0) {
      m->group = strdup(reqs[0]->m.name);
      reqs[0]->m.group = reqs[0]->m.group ? reqs[0]->m.group : strdup(reqs[0]->m.name);
      if (!m->group || !reqs[0]->m.group) {
        rc = fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
        goto out;
      }
      m->gsize = reqs[0]->m.gsize = n;
    }
    if (m->kind == EK_ALLTOALL && m->nshape != s->size) {
      rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: sendcounts needs %d entries", fn, s->size);
      goto out;
    }
    if (m->kind == EK_BROADCAST && (m->root < 0 || m->root >= s->size)) {
      rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: root %d outside [0, %d) of process set %d", fn, m->root, s->size, set);
      goto out;
    }
  }
  char key[1100];
  for (int i = 0; i < n; i++) {
    inflight_key(key, sizeof(key), set, reqs[i]->m.name);
    if (map_get(&e->inflight, key)) {
      rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: a tensor named '%s' is already pending in process set %d", fn,
                reqs[i]->m.name, set);
      for (int k = 0; k < i; k++) {
        inflight_key(key, sizeof(key), set, reqs[k]->m.name);
        map_del(&e->inflight, key);
      }
      goto out;
    }
    if (map_put(&e->inflight, key, (void*)1) != 0) {
      rc = fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
      goto out;
    }
  }
  h = handle_new(e, n);
  if (h < 0) {
    for (int i = 0; i < n; i++) {
      inflight_key(key, sizeof(key), set, reqs[i]->m.name);
      map_del(&e->inflight, key);
    }
    rc = fail(COLLIE_ERR_INTERNAL, "%s: out of memory for a handle", fn);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    struct req* r = reqs[i];
    r->handle = h;
    r->set = set;
    r->state = RQ_NEW;
    r->next = NULL;
    if (e->in_tail) e->in_tail->next = r;
    else e->in_head = r;
    e->in_tail = r;
    reqs[i] = NULL;
  }
out:
  pthread_mutex_unlock(&e->lock);
  for (int i = 0; i < n; i++) req_free(reqs[i]);
  return rc ? rc : h;
}

static struct req* req_new(const char* name, int kind, ncclDataType_t dt, size_t count) {
  struct req* r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->m.kind = kind;
  r->m.dtype = dt;
  r->m.count = count;
  r->m.prescale = r->m.postscale = 1.0;
  r->m.op = COLLIE_SUM;
  if (name && !(r->m.name = strdup(name))) {
    free(r);
    return NULL;
  }
  return r;
}

static int check_common(const char* fn, const char* name, ncclDataType_t dt, size_t count) {
  if (name && strlen(name) > NAME_MAX_LEN)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: name longer than %d characters", fn, NAME_MAX_LEN);
  if (!dtype_valid(dt)) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", fn, (int)dt);
  if (count > ((size_t)1 << 56) / dtype_size(dt))
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: count %zu too large", fn, count);
  return 0;
}

static int check_op(const char* fn, int op) {
  if (op == COLLIE_SUM || op == COLLIE_AVERAGE || op == COLLIE_MIN || op == COLLIE_MAX || op == COLLIE_PRODUCT) return 0;
  return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: invalid op %d (COLLIE_SUM, AVERAGE, MIN, MAX or PRODUCT)", fn, op);
}

static int check_scale(const char* fn, ncclDataType_t dt, double pre, double post) {
  if (!isfinite(pre) || !isfinite(post))
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: scale factors must be finite", fn);
  if ((pre != 1.0 || post != 1.0) && !engine_dtype_is_float(dt))
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: scale factors apply to floating-point dtypes only (%s)", fn,
                dtype_name(dt));
  return 0;
}

static int grouped(int n, const char* const* names, const void* const* sendbufs, void* const* recvbufs,
                   const size_t* counts, ncclDataType_t dt, int op, double pre, double post, int set, const char* fn) {
  int rc;
  if (n < 1 || n > (1 << 20) || !sendbufs || !recvbufs || !counts)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: bad group (n %d, NULL arrays?)", fn, n);
  if ((rc = check_op(fn, op)) || (rc = check_scale(fn, dt, pre, post))) return rc;
  struct req** reqs = calloc((size_t)n, sizeof(*reqs));
  if (!reqs) return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  for (int i = 0; i < n; i++) {
    const char* name = names ? names[i] : NULL;
    if ((rc = check_common(fn, name, dt, counts[i])) != 0) goto bad;
    if (counts[i] && (!sendbufs[i] || !recvbufs[i])) {
      rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: NULL buffer with count %zu", fn, counts[i]);
      goto bad;
    }
    reqs[i] = req_new(name, EK_ALLREDUCE, dt, counts[i]);
    if (!reqs[i]) {
      rc = fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
      goto bad;
    }
    reqs[i]->m.op = op;
    reqs[i]->m.prescale = pre;
    reqs[i]->m.postscale = post;
    reqs[i]->sendbuf = sendbufs[i];
    reqs[i]->recvbuf = recvbufs[i];
  }
  rc = submit(reqs, n, set, fn);
  free(reqs);
  return rc;
bad:
  for (int i = 0; i < n; i++) req_free(reqs[i]);
  free(reqs);
  return rc;
}

COLLIE_EXPORT int collie_allreduce_async(const char* name, const void* sendbuf, void* recvbuf, size_t count,
                                         ncclDataType_t dtype, int op, double prescale, double postscale,
                                         int process_set) {
  const char* names[1] = {name};
  const void* s[1] = {sendbuf};
  void* r[1] = {recvbuf};
  size_t c[1] = {count};
  return grouped(1, names, s, r, c, dtype, op, prescale, postscale, process_set, "collie_allreduce_async");
}

COLLIE_EXPORT int collie_grouped_allreduce_async(int n, const char* const* names, const void* const* sendbufs,
                                                 void* const* recvbufs, const size_t* counts, ncclDataType_t dtype,
                                                 int op, double prescale, double postscale, int process_set) {
  return grouped(n, names, sendbufs, recvbufs, counts, dtype, op, prescale, postscale, process_set,
                 "collie_grouped_allreduce_async");
}

COLLIE_EXPORT int collie_allgather_nd_async(const char* name, const void* sendbuf, int ndim, const int64_t* shape,
                                            ncclDataType_t dtype, int process_set) {
  const char* fn = "collie_allgather_async";
  if (ndim < 1 || ndim > 64 || !shape) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: bad shape (ndim %d)", fn, ndim);
  size_t count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] > 0 && count > ((size_t)1 << 56) / (size_t)shape[i]))
      return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: bad dimension %d: %lld", fn, i, (long long)shape[i]);
    count *= (size_t)shape[i];
  }
  int rc = check_common(fn, name, dtype, count);
  if (rc) return rc;
  if (count && !sendbuf) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: sendbuf is NULL", fn);
  struct req* r = req_new(name, EK_ALLGATHER, dtype, count);
  if (r) r->m.shape = malloc(sizeof(int64_t) * (size_t)ndim);
  if (!r || !r->m.shape) {
    req_free(r);
    return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  }
  memcpy(r->m.shape, shape, sizeof(int64_t) * (size_t)ndim);
  r->m.nshape = ndim;
  r->sendbuf = sendbuf;
  return submit(&r, 1, process_set, fn);
}

COLLIE_EXPORT int collie_allgather_async(const char* name, const void* sendbuf, size_t count, ncclDataType_t dtype,
                                         int process_set) {
  int64_t shape[1] = {(int64_t)count};
  if (count > ((size_t)1 << 56)) return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_allgather_async: count too large");
  return collie_allgather_nd_async(name, sendbuf, 1, shape, dtype, process_set);
}

COLLIE_EXPORT int collie_broadcast_async(const char* name, void* buf, size_t count, ncclDataType_t dtype, int root,
                                         int process_set) {
  const char* fn = "collie_broadcast_async";
  int rc = check_common(fn, name, dtype, count);
  if (rc) return rc;
  if (count && !buf) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: buf is NULL", fn);
  if (root < 0) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: root %d is negative", fn, root);
  struct req* r = req_new(name, EK_BROADCAST, dtype, count);
  if (!r) return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  r->m.root = root;
  r->sendbuf = buf;
  r->recvbuf = buf;
  return submit(&r, 1, process_set, fn);
}

COLLIE_EXPORT int collie_alltoall_async(const char* name, const void* sendbuf, const size_t* sendcounts,
                                        ncclDataType_t dtype, int process_set) {
  const char* fn = "collie_alltoall_async";
  int n = collie_process_set_size(process_set);
  if (n < 0) return n;
  if (!sendcounts) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: sendcounts is NULL", fn);
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (sendcounts[i] > ((size_t)1 << 56)) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: sendcounts[%d] too large", fn, i);
    total += sendcounts[i];
  }
  int rc = check_common(fn, name, dtype, total);
  if (rc) return rc;
  if (total && !sendbuf) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: sendbuf is NULL", fn);
  struct req* r = req_new(name, EK_ALLTOALL, dtype, total);
  if (r) r->m.shape = malloc(sizeof(int64_t) * (size_t)n);
  if (!r || !r->m.shape) {
    req_free(r);
    return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  }
  for (int i = 0; i < n; i++) r->m.shape[i] = (int64_t)sendcounts[i];
  r->m.nshape = n;
  r->sendbuf = sendbuf;
  return submit(&r, 1, process_set, fn);
}

COLLIE_EXPORT int collie_reducescatter_async(const char* name, const void* sendbuf, size_t count, ncclDataType_t dtype,
                                             int op, int process_set) {
  const char* fn = "collie_reducescatter_async";
  int rc = check_common(fn, name, dtype, count);
  if (rc || (rc = check_op(fn, op))) return rc;
  if (count && !sendbuf) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: sendbuf is NULL", fn);
  struct req* r = req_new(name, EK_REDUCESCATTER, dtype, count);
  if (!r) return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  r->m.op = op;
  r->sendbuf = sendbuf;
  return submit(&r, 1, process_set, fn);
}

/* ------------------------------------------------------------ handles */

COLLIE_EXPORT int collie_poll(int id) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  struct handle* h = handle_get(&engine_g, id);
  int v = h ? h->done : fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_poll: invalid handle %d", id);
  pthread_mutex_unlock(&engine_g.lock);
  return v;
}

/* Lock held; returns with it held. */
static int wait_locked(struct engine* e, int id, const char* fn) {
  for (;;) {
    struct handle* h = handle_get(e, id);
    if (!h) return fail(e->initialized ? COLLIE_ERR_INVALID_ARGUMENT : COLLIE_ERR_NOT_INITIALIZED,
                        "%s: invalid handle %d", fn, id);
    if (h->done) {
      if (h->status) fail(h->status, "%s", h->err ? h->err : "collie: failed");
      return h->status;
    }
    pthread_cond_wait(&e->done_cond, &e->lock);
  }
}

COLLIE_EXPORT int collie_wait(int id) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  int rc = wait_locked(&engine_g, id, "collie_wait");
  pthread_mutex_unlock(&engine_g.lock);
  return rc;
}

COLLIE_EXPORT int collie_result(int id, void** buf, size_t* count) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  struct handle* h = handle_get(&engine_g, id);
  int rc = 0;
  if (!h) rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_result: invalid handle %d", id);
  else if (!h->done) rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_result: handle %d is still pending", id);
  else if (h->status) rc = fail(h->status, "%s", h->err ? h->err : "collie: failed");
  else {
    if (buf) *buf = h->result;
    if (count) *count = h->result_count;
  }
  pthread_mutex_unlock(&engine_g.lock);
  return rc;
}

COLLIE_EXPORT int collie_result_counts(int id, size_t* counts) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  struct handle* h = handle_get(&engine_g, id);
  int rc = 0;
  if (!h || !counts) rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_result_counts: invalid handle %d or NULL counts", id);
  else if (!h->done) rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_result_counts: handle %d is still pending", id);
  else if (h->status) rc = fail(h->status, "%s", h->err ? h->err : "collie: failed");
  else if (!h->counts) rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_result_counts: handle %d has no per-rank counts", id);
  else memcpy(counts, h->counts, sizeof(size_t) * (size_t)h->ncounts);
  pthread_mutex_unlock(&engine_g.lock);
  return rc;
}

COLLIE_EXPORT const char* collie_handle_error(int id) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  struct handle* h = handle_get(&engine_g, id);
  const char* s = h && h->err ? h->err : "";
  pthread_mutex_unlock(&engine_g.lock);
  return s;
}

COLLIE_EXPORT int collie_release(int id) {
  pthread_once(&sync_once, sync_init);
  struct engine* e = &engine_g;
  pthread_mutex_lock(&e->lock);
  int rc = wait_locked(e, id, "collie_release");
  if (handle_get(e, id)) {
    handle_drop(e, id);
    rc = 0;
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* Submits, waits, and returns the handle's value (or its error). */
static int blocking(struct req* r, int set, const char* fn) {
  int h = submit(&r, 1, set, fn);
  if (h < 0) return h;
  pthread_mutex_lock(&engine_g.lock);
  int rc = wait_locked(&engine_g, h, fn);
  struct handle* hd = handle_get(&engine_g, h);
  if (hd) {
    if (rc == 0) rc = (int)hd->value;
    handle_drop(&engine_g, h);
  }
  pthread_mutex_unlock(&engine_g.lock);
  return rc;
}

COLLIE_EXPORT int collie_barrier(int process_set) {
  pthread_once(&sync_once, sync_init);
  char name[64];
  pthread_mutex_lock(&engine_g.lock);
  struct pset* s = engine_g.initialized ? engine_g.sets : NULL;
  while (s && s->id != process_set) s = s->next;
  uint64_t seq = s ? s->barrier_seq++ : 0;
  pthread_mutex_unlock(&engine_g.lock);
  snprintf(name, sizeof(name), "collie.barrier.%llu", (unsigned long long)seq);
  struct req* r = req_new(name, EK_BARRIER, ncclUint8, 0);
  if (!r) return fail(COLLIE_ERR_INTERNAL, "collie_barrier: out of memory");
  return blocking(r, process_set, "collie_barrier");
}

COLLIE_EXPORT int collie_join(void) {
  pthread_once(&sync_once, sync_init);
  struct engine* e = &engine_g;
  pthread_mutex_lock(&e->lock);
  int rc = check_running(e, "collie_join");
  if (rc == 0 && e->join_handle >= 0) rc = fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_join: another thread is joining");
  int h = -1;
  if (rc == 0) {
    h = handle_new(e, 1);
    if (h < 0) rc = fail(COLLIE_ERR_INTERNAL, "collie_join: out of memory");
  }
  if (rc == 0) {
    e->join_handle = h;
    rc = wait_locked(e, h, "collie_join");
    struct handle* hd = handle_get(e, h);
    if (hd) {
      if (rc == 0) rc = (int)hd->value;
      handle_drop(e, h);
    }
  }
  pthread_mutex_unlock(&e->lock);
  return rc;
}

/* ------------------------------------------------------------ process sets */

static int set_op(int kind, const int64_t* list, int n, const char* fn) {
  char name[64];
  pthread_mutex_lock(&engine_g.lock);
  uint64_t seq = engine_g.setop_seq++;
  pthread_mutex_unlock(&engine_g.lock);
  snprintf(name, sizeof(name), "collie.process_set.%llu", (unsigned long long)seq);
  struct req* r = req_new(name, kind, ncclInt64, 0);
  if (r) r->m.shape = malloc(sizeof(int64_t) * (size_t)n);
  if (!r || !r->m.shape) {
    req_free(r);
    return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  }
  memcpy(r->m.shape, list, sizeof(int64_t) * (size_t)n);
  r->m.nshape = n;
  return blocking(r, COLLIE_WORLD, fn);
}

static int cmp_i64(const void* a, const void* b) {
  int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
  return (x > y) - (x < y);
}

COLLIE_EXPORT int collie_add_process_set(const int* ranks, int n) {
  const char* fn = "collie_add_process_set";
  int size = collie_size();
  if (size < 0) return size;
  if (!ranks || n < 1 || n > size) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: need 1..%d ranks", fn, size);
  int64_t* list = malloc(sizeof(int64_t) * (size_t)n);
  if (!list) return fail(COLLIE_ERR_INTERNAL, "%s: out of memory", fn);
  for (int i = 0; i < n; i++) list[i] = ranks[i];
  qsort(list, (size_t)n, sizeof(int64_t), cmp_i64);
  for (int i = 0; i < n; i++) {
    if (list[i] < 0 || list[i] >= size || (i && list[i] == list[i - 1])) {
      int64_t bad = list[i];
      free(list);
      return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: rank %lld is out of range or repeated", fn, (long long)bad);
    }
  }
  int rc = set_op(EK_ADD_SET, list, n, fn);
  free(list);
  return rc;
}

COLLIE_EXPORT int collie_remove_process_set(int id) {
  const char* fn = "collie_remove_process_set";
  if (id == COLLIE_WORLD) return fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: the world set cannot be removed", fn);
  if (collie_process_set_size(id) < 0) return COLLIE_ERR_INVALID_ARGUMENT;
  int64_t v = id;
  return set_op(EK_REMOVE_SET, &v, 1, fn);
}

static int set_query(int id, int what, const char* fn) {
  pthread_once(&sync_once, sync_init);
  pthread_mutex_lock(&engine_g.lock);
  int v;
  if (!engine_g.initialized) {
    v = fail(COLLIE_ERR_NOT_INITIALIZED, "%s: the engine is not initialised", fn);
  } else {
    struct pset* s = engine_g.sets;
    while (s && s->id != id) s = s->next;
    if (!s) v = fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: no process set %d", fn, id);
    else if (what == 0) v = s->rank >= 0 ? s->rank : fail(COLLIE_ERR_INVALID_ARGUMENT, "%s: not a member of set %d", fn, id);
    else if (what == 1) v = s->size;
    else v = s->rank >= 0;
  }
  pthread_mutex_unlock(&engine_g.lock);
  return v;
}

COLLIE_EXPORT int collie_process_set_rank(int id) { return set_query(id, 0, "collie_process_set_rank"); }
COLLIE_EXPORT int collie_process_set_size(int id) { return set_query(id, 1, "collie_process_set_size"); }
COLLIE_EXPORT int collie_process_set_included(int id) { return set_query(id, 2, "collie_process_set_included"); }

/* ------------------------------------------------------------ timeline, stats */

COLLIE_EXPORT int collie_start_timeline(const char* path, int mark_cycles) {
  pthread_once(&sync_once, sync_init);
  if (!path || !*path) return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_start_timeline: path is empty");
  int rank = collie_rank();
  if (rank < 0) return rank;
  if (rank != 0) return 0;
  if (timeline_start(&engine_g.tl, path, mark_cycles != 0) != 0)
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_start_timeline: cannot open %s", path);
  return 0;
}

COLLIE_EXPORT int collie_stop_timeline(void) {
  pthread_once(&sync_once, sync_init);
  int rank = collie_rank();
  if (rank < 0) return rank;
  timeline_stop(&engine_g.tl);
  return 0;
}

COLLIE_EXPORT int collie_engine_stats(collie_engine_stats_t* out) {
  pthread_once(&sync_once, sync_init);
  if (!out || out->size < sizeof(size_t) || out->size > (1u << 20))
    return fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_engine_stats: set stats->size to sizeof(collie_engine_stats_t)");
  pthread_mutex_lock(&engine_g.lock);
  if (!engine_g.initialized) {
    pthread_mutex_unlock(&engine_g.lock);
    return fail(COLLIE_ERR_NOT_INITIALIZED, "collie_engine_stats: the engine is not initialised");
  }
  /* The background thread updates these without the lock: a snapshot may be a cycle stale. */
  collie_engine_stats_t st;
  memcpy(&st, &engine_g.stats, sizeof(st));
  st.fusion_threshold = __atomic_load_n(&engine_g.fusion, __ATOMIC_RELAXED);
  st.cycle_time_ms = (double)__atomic_load_n(&engine_g.cycle_us, __ATOMIC_RELAXED) / 1000.0;
  pthread_mutex_unlock(&engine_g.lock);
  size_t caller = out->size;
  memcpy(out, &st, COLLIE_MIN(caller, sizeof(st)));
  out->size = caller;
  return 0;
}
