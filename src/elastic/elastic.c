/* collie_elastic_*: the worker side of elastic training. Joins the rendezvous
 * store (backend.h: the embedded store through client.c, or etcd), builds each epoch's communicator from the unique ID that
 * the epoch's rank 0 publishes there, runs the engine on it, and keeps the
 * registered training state (commit / restore / sync by engine broadcast). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "elastic/backend.h"
#include "engine/engine.h"
#include "failures.h"

#define EL_NAME_MAX 128
#define EL_POLL_MS 20
#define EL_CONNECT_MS 30000
#define EL_IO_MS 30000
/* While an epoch's communicator is being built: how often its progress is
 * polled, and how often the store is asked whether a member was lost. */
#define EL_INIT_POLL_MS 2
#define EL_INIT_WATCH_MS 50

struct el_state {
  char name[EL_NAME_MAX];
  void* ptr;
  void* saved;
  size_t bytes;
};

static struct {
  int initialized;
  struct estore sc;
  int sc_open;
  uint32_t worker_id, epoch, rank, size, resets;
  ncclComm_t comm;
  int engine_up;
  int64_t timeout_ms;
  int64_t hb_ms;
  /* heartbeat thread */
  pthread_t hb;
  int hb_started;
  pthread_mutex_t hb_mu;
  pthread_cond_t hb_cv;
  int hb_stop;
  struct el_state* st;
  int nst, capst;
  int committed;
  int clean_change; /* the last check agreed on a membership change: the communicator is healthy */
} E = {.hb_mu = PTHREAD_MUTEX_INITIALIZER, .hb_cv = PTHREAD_COND_INITIALIZER};


/* The message goes to ncclGetLastError, the WARN log (err_set) and
 * collie_last_error(). */
__attribute__((format(printf, 2, 3))) static int el_fail(int code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  err_set(code == COLLIE_ERR_INVALID_ARGUMENT ? ncclInvalidArgument : ncclSystemError, "%s", buf);
  engine_last_error_set(buf);
  return code;
}

/* ---- store requests ------------------------------------------------------ */

struct reply {
  uint8_t buf[EPROTO_MAX_REPLY];
  size_t len;
  struct ebuf in;
  uint32_t status;
  char text[EPROTO_MAX_TEXT + 1];
};

/* One request; on success `r` holds the status and a reader on the rest. */
static int call(int type, const uint8_t* req, size_t len, struct reply* r) {
  if (estore_call(&E.sc, type, req, len, r->buf, sizeof(r->buf), &r->len) != ncclSuccess)
    return COLLIE_ERR_COMMUNICATION;
  ebuf_reader(&r->in, r->buf, r->len);
  r->status = ebuf_get_u32(&r->in);
  r->text[0] = '\0';
  if (r->status == ESTATUS_FAIL || r->status == ESTATUS_EXCLUDED || r->status == ESTATUS_REFUSED)
    ebuf_get_str(&r->in, r->text, sizeof(r->text), EPROTO_MAX_TEXT);
  if (r->in.bad) return el_fail(COLLIE_ERR_COMMUNICATION, "elastic: malformed reply from the rendezvous store");
  return 0;
}

static int call_u32(int type, uint32_t v, struct reply* r) {
  uint8_t m[4];
  struct ebuf b;
  ebuf_writer(&b, m, sizeof(m));
  ebuf_put_u32(&b, v);
  return call(type, m, b.len, r);
}

static int status_error(const struct reply* r, const char* what) {
  if (r->status == ESTATUS_FAIL) return el_fail(COLLIE_ERR_MEMBERSHIP, "elastic: the job failed: %s", r->text);
  if (r->status == ESTATUS_EXCLUDED) return el_fail(COLLIE_ERR_MEMBERSHIP, "elastic: %s", r->text);
  return el_fail(COLLIE_ERR_INTERNAL, "elastic: the rendezvous store refused %s: %s (status %u)", what, r->text,
                 r->status);
}

static void* hb_main(void* arg) {
  (void)arg;
  static struct reply r; /* only this thread uses it */
  pthread_mutex_lock(&E.hb_mu);
  while (!E.hb_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += E.hb_ms / 1000;
    ts.tv_nsec += (E.hb_ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&E.hb_cv, &E.hb_mu, &ts);
    if (E.hb_stop) break;
    pthread_mutex_unlock(&E.hb_mu);
    /* Only liveness matters here; collie_elastic_check asks afresh. A lost
     * store shows up at the next request of the training thread. */
    call_u32(EREQ_HEARTBEAT, 0, &r);
    pthread_mutex_lock(&E.hb_mu);
  }
  pthread_mutex_unlock(&E.hb_mu);
  return NULL;
}

/* ---- rendezvous ---------------------------------------------------------- */

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

/* Waits for an epoch newer than E.epoch that includes this worker. */
static int rdzv_wait(int64_t deadline) {
  static struct reply r;
  for (;;) {
    int rc = call_u32(EREQ_RDZV, E.epoch, &r);
    if (rc) return rc;
    if (r.status == ESTATUS_OK) {
      uint32_t epoch = ebuf_get_u32(&r.in), rank = ebuf_get_u32(&r.in), size = ebuf_get_u32(&r.in);
      uint32_t resets = ebuf_get_u32(&r.in);
      if (r.in.bad || size < 1 || size > EPROTO_MAX_WORKERS || rank >= size || epoch <= E.epoch)
        return el_fail(COLLIE_ERR_COMMUNICATION, "elastic: malformed plan from the rendezvous store");
      E.epoch = epoch;
      E.rank = rank;
      E.size = size;
      E.resets = resets;
      INFO(LOG_INIT, "elastic: worker %u is rank %u of %u in epoch %u (resets so far: %u)", E.worker_id, rank,
           size, epoch, resets);
      return 0;
    }
    if (r.status != ESTATUS_WAIT) return status_error(&r, "the rendezvous");
    if (time_ms() > deadline)
      return el_fail(COLLIE_ERR_COMMUNICATION,
                     "elastic: no epoch formed within %lld s (COLLIE_ELASTIC_TIMEOUT); worker %u waited at the "
                     "rendezvous",
                     (long long)(E.timeout_ms / 1000), E.worker_id);
    sleep_ms(EL_POLL_MS);
  }
}

/* 0: id filled; 1: the epoch is stale, rendezvous again; <0: error. */
static int exchange_uid(ncclUniqueId* id, int64_t deadline) {
  static struct reply r;
  if (E.rank == 0) {
    if (ncclGetUniqueId(id) != ncclSuccess)
      return el_fail(COLLIE_ERR_COMMUNICATION, "elastic: ncclGetUniqueId failed: %s", ncclGetLastError(NULL));
    uint8_t m[4 + EPROTO_UID_BYTES];
    struct ebuf b;
    ebuf_writer(&b, m, sizeof(m));
    ebuf_put_u32(&b, E.epoch);
    ebuf_put_bytes(&b, id->internal, EPROTO_UID_BYTES);
    int rc = call(EREQ_PUBLISH, m, b.len, &r);
    if (rc) return rc;
    if (r.status == ESTATUS_STALE) return 1;
    if (r.status != ESTATUS_OK) return status_error(&r, "the unique ID");
    return 0;
  }
  for (;;) {
    int rc = call_u32(EREQ_GET_UID, E.epoch, &r);
    if (rc) return rc;
    if (r.status == ESTATUS_STALE) return 1;
    if (r.status == ESTATUS_OK) {
      ebuf_get_bytes(&r.in, id->internal, EPROTO_UID_BYTES);
      if (!ebuf_done(&r.in)) return el_fail(COLLIE_ERR_COMMUNICATION, "elastic: malformed unique ID reply");
      return 0;
    }
    if (r.status != ESTATUS_WAIT) return status_error(&r, "the unique ID");
    if (time_ms() > deadline)
      return el_fail(COLLIE_ERR_COMMUNICATION, "elastic: rank 0 of epoch %u published no unique ID within %lld s",
                     E.epoch, (long long)(E.timeout_ms / 1000));
    sleep_ms(EL_POLL_MS);
  }
}

/* Builds the epoch's communicator without ever being stuck in it: the init
 * runs nonblocking while this thread asks the store whether the epoch is
 * still whole. A member that dies before or during the init never reaches
 * the bootstrap, and the others would wait for it until
 * COLLIE_BOOTSTRAP_TIMEOUT; the store sees the death at once (closed
 * connection or missed heartbeats), so the half-built communicator is
 * aborted and everyone rendezvouses again. The finished communicator turns
 * blocking: the engine's thread then runs its collectives itself.
 * 0: E.comm is ready; 1: abandoned, rendezvous again; <0: error. */
static int build_comm(const ncclUniqueId* id, int64_t deadline) {
  static struct reply r;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t nr = ncclCommInitRankConfig(&E.comm, (int)E.size, *id, (int)E.rank, &cfg);
  int64_t next_watch = time_ms() + EL_INIT_WATCH_MS;
  int rc = 0;
  while (nr == ncclInProgress) {
    sleep_ms(EL_INIT_POLL_MS);
    if (ncclCommGetAsyncError(E.comm, &nr) != ncclSuccess) nr = ncclInternalError;
    if (nr != ncclInProgress) break;
    int64_t now = time_ms();
    if (now >= deadline) {
      rc = el_fail(COLLIE_ERR_COMMUNICATION,
                   "elastic: epoch %u's communicator was not built within %lld s (COLLIE_ELASTIC_TIMEOUT) although "
                   "the store lost none of its %u members",
                   E.epoch, (long long)(E.timeout_ms / 1000), E.size);
      goto abandon;
    }
    if (now < next_watch) continue;
    next_watch = now + EL_INIT_WATCH_MS;
    rc = call_u32(EREQ_HEARTBEAT, E.epoch, &r);
    if (rc) goto abandon;
    if (r.status != ESTATUS_OK) {
      /* The job failed: the rendezvous reports why. */
      WARN("elastic: the store ended epoch %u while its communicator was being built", E.epoch);
      rc = 1;
      goto abandon;
    }
    uint32_t epoch = ebuf_get_u32(&r.in), pending = ebuf_get_u32(&r.in), broken = ebuf_get_u32(&r.in);
    (void)pending; /* a newcomer waits for the next check; the init goes on */
    if (r.in.bad) {
      rc = el_fail(COLLIE_ERR_COMMUNICATION, "elastic: malformed heartbeat reply from the rendezvous store");
      goto abandon;
    }
    if (epoch != E.epoch || broken) {
      WARN("elastic: epoch %u lost a member while its communicator was being built; aborting it and rendezvousing "
           "again",
           E.epoch);
      rc = 1;
      goto abandon;
    }
  }
  if (nr != ncclSuccess) {
    WARN("elastic: building epoch %u's communicator failed (%s); rendezvous again", E.epoch,
         E.comm ? comm_error_msg(E.comm) : ncclGetLastError(NULL));
    rc = 1;
    goto abandon;
  }
  if (async_make_blocking(E.comm) != ncclSuccess) {
    rc = el_fail(COLLIE_ERR_INTERNAL, "elastic: %s", ncclGetLastError(NULL));
    goto abandon;
  }
  return 0;
abandon:
  if (E.comm) ncclCommAbort(E.comm);
  E.comm = NULL;
  return rc;
}

static void teardown_world(int broken) {
  if (E.engine_up) {
    /* A broken communicator first fails whatever the engine has in flight,
     * so its shutdown does not wait on a dead peer. */
    if (broken && E.comm) ncclCommRevoke(E.comm, NCCL_REVOKE_DEFAULT);
    collie_shutdown();
    E.engine_up = 0;
  }
  if (E.comm) {
    if (broken)
      ncclCommAbort(E.comm);
    else
      ncclCommDestroy(E.comm);
    E.comm = NULL;
  }
}

static int comm_broken(void) {
  if (!E.comm) return 0;
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(E.comm, &async) != ncclSuccess) return 1;
  return async != ncclSuccess && async != ncclInProgress;
}

/* Rendezvous, communicator, engine, and (when `sync`) state: retried until
 * it works or the store says the job is over. */
static int build_world(int sync) {
  int64_t deadline = time_ms() + E.timeout_ms;
  for (;;) {
    int rc = rdzv_wait(deadline);
    if (rc) return rc;
    ncclUniqueId id;
    rc = exchange_uid(&id, deadline);
    if (rc < 0) return rc;
    if (rc == 1) {
      INFO(LOG_INIT, "elastic: epoch %u was superseded before its communicator existed; rendezvous again", E.epoch);
      continue;
    }
    rc = build_comm(&id, deadline);
    if (rc < 0) return rc;
    if (rc == 1) continue;
    rc = collie_init_comm(E.comm);
    if (rc != 0) {
      WARN("elastic: starting the engine on epoch %u failed (%s); rendezvous again", E.epoch, collie_last_error());
      teardown_world(1);
      continue;
    }
    E.engine_up = 1;
    if (!sync) return 0;
    collie_elastic_state_restore();
    rc = collie_elastic_state_sync();
    if (rc == 0) return 0;
    if (rc == COLLIE_ERR_MISMATCH) return rc;
    WARN("elastic: syncing the state in epoch %u failed (%s); rendezvous again", E.epoch, collie_last_error());
    teardown_world(1);
  }
}

/* ---- public API ----------------------------------------------------------- */

static void stop_heartbeat(void) {
  if (!E.hb_started) return;
  pthread_mutex_lock(&E.hb_mu);
  E.hb_stop = 1;
  pthread_cond_signal(&E.hb_cv);
  pthread_mutex_unlock(&E.hb_mu);
  pthread_join(E.hb, NULL);
  E.hb_started = 0;
}

static void release_all(void) {
  stop_heartbeat();
  if (E.sc_open) estore_close(&E.sc);
  E.sc_open = 0;
  for (int i = 0; i < E.nst; i++) free(E.st[i].saved);
  free(E.st);
  E.st = NULL;
  E.nst = E.capst = 0;
  E.committed = 0;
  E.epoch = E.rank = E.size = E.resets = E.worker_id = 0;
}

COLLIE_EXPORT int collie_elastic_init(void) {
  if (E.initialized) return el_fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_elastic_init: already initialised");
  const char* addr = param_str(P_COLLIE_RENDEZVOUS);
  const char* hex = param_str(P_COLLIE_RENDEZVOUS_SECRET);
  if (!addr)
    return el_fail(COLLIE_ERR_INVALID_ARGUMENT,
                   "collie_elastic_init: COLLIE_RENDEZVOUS must be set (start the job with collie-run --elastic, "
                   "start collie-rendezvous and pass on what it prints, or name an etcd cluster: etcd://host:port)");
  E.timeout_ms = param_int(P_COLLIE_ELASTIC_TIMEOUT, 1, 7 * 24 * 3600) * 1000;
  E.hb_ms = param_int(P_COLLIE_ELASTIC_HEARTBEAT_MS, 10, 3600 * 1000);
  char host[EPROTO_MAX_KEY + 1] = "";
  gethostname(host, sizeof(host) - 1);
  const char* slot = param_str(P_COLLIE_ELASTIC_SLOT);
  char key[EPROTO_MAX_KEY + 1];
  snprintf(key, sizeof(key), "%s", slot ? slot : host);

  int rc;
  E.sc_open = 1;
  ncclResult_t orc = estore_open(&E.sc, addr, hex, EL_CONNECT_MS, EL_IO_MS);
  if (orc != ncclSuccess) {
    /* A setting that cannot work is the caller's to fix; a store that does
     * not answer may come back. */
    rc = el_fail(orc == ncclInvalidArgument ? COLLIE_ERR_INVALID_ARGUMENT : COLLIE_ERR_COMMUNICATION,
                 "collie_elastic_init: %s", ncclGetLastError(NULL));
    goto fail;
  }
  {
    static struct reply r;
    uint8_t m[16 + 2 * EPROTO_MAX_KEY];
    struct ebuf b;
    ebuf_writer(&b, m, sizeof(m));
    ebuf_put_u32(&b, (uint32_t)getpid());
    ebuf_put_str(&b, key, EPROTO_MAX_KEY);
    ebuf_put_str(&b, host, EPROTO_MAX_KEY);
    rc = call(EREQ_REGISTER, m, b.len, &r);
    if (rc) goto fail;
    if (r.status != ESTATUS_OK) {
      rc = status_error(&r, "this worker");
      goto fail;
    }
    E.worker_id = ebuf_get_u32(&r.in);
    (void)ebuf_get_u32(&r.in);
  }
  E.epoch = 0;
  E.hb_stop = 0;
  log_enabled(LOG_WARN, LOG_ALL); /* the heartbeat thread may log; it must not read the environment */
  if (pthread_create(&E.hb, NULL, hb_main, NULL) != 0) {
    rc = el_fail(COLLIE_ERR_INTERNAL, "collie_elastic_init: cannot start the heartbeat thread");
    goto fail;
  }
  E.hb_started = 1;
  rc = build_world(0);
  if (rc) goto fail;
  E.initialized = 1;
  return 0;
fail:
  teardown_world(1);
  release_all();
  return rc;
}

COLLIE_EXPORT int collie_elastic_shutdown(void) {
  if (!E.initialized) return 0;
  teardown_world(comm_broken());
  static struct reply r;
  if (call(EREQ_LEAVE, NULL, 0, &r) != 0) WARN("elastic: could not tell the store that worker %u leaves", E.worker_id);
  release_all();
  E.initialized = 0;
  return 0;
}

COLLIE_EXPORT int collie_elastic_state_add(const char* name, void* ptr, size_t bytes) {
  if (!name || !name[0] || strlen(name) >= EL_NAME_MAX || (!ptr && bytes))
    return el_fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_elastic_state_add: need a name of 1..%d characters and a buffer",
                   EL_NAME_MAX - 1);
  for (int i = 0; i < E.nst; i++)
    if (strcmp(E.st[i].name, name) == 0)
      return el_fail(COLLIE_ERR_INVALID_ARGUMENT, "collie_elastic_state_add: '%s' is already registered", name);
  if (E.nst == E.capst) {
    int cap = E.capst ? 2 * E.capst : 8;
    struct el_state* n = realloc(E.st, (size_t)cap * sizeof(*n));
    if (!n) return el_fail(COLLIE_ERR_INTERNAL, "collie_elastic_state_add: out of memory");
    E.st = n;
    E.capst = cap;
  }
  struct el_state* s = &E.st[E.nst];
  memset(s, 0, sizeof(*s));
  s->saved = malloc(bytes ? bytes : 1);
  if (!s->saved) return el_fail(COLLIE_ERR_INTERNAL, "collie_elastic_state_add: out of memory (%zu bytes)", bytes);
  snprintf(s->name, sizeof(s->name), "%s", name);
  s->ptr = ptr;
  s->bytes = bytes;
  if (bytes) memcpy(s->saved, ptr, bytes);
  E.nst++;
  return 0;
}

COLLIE_EXPORT int collie_elastic_state_commit(void) {
  for (int i = 0; i < E.nst; i++)
    if (E.st[i].bytes) memcpy(E.st[i].saved, E.st[i].ptr, E.st[i].bytes);
  E.committed = 1;
  return 0;
}

COLLIE_EXPORT int collie_elastic_state_restore(void) {
  for (int i = 0; i < E.nst; i++)
    if (E.st[i].bytes) memcpy(E.st[i].ptr, E.st[i].saved, E.st[i].bytes);
  return 0;
}

static int wait_op(int h) {
  if (h < 0) return h;
  int rc = collie_wait(h);
  collie_release(h);
  return rc;
}

COLLIE_EXPORT int collie_elastic_state_sync(void) {
  if (!E.engine_up) return el_fail(COLLIE_ERR_NOT_INITIALIZED, "collie_elastic_state_sync: collie_elastic_init first");
  /* Agree on what the state is before moving it: a worker with other names
   * or sizes would otherwise stall the engine on a tensor nobody else sends. */
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < E.nst; i++) {
    for (const char* p = E.st[i].name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    h = (h ^ E.st[i].bytes) * 0x100000001b3ULL;
  }
  uint64_t root_h = h;
  int rc = wait_op(collie_broadcast_async("collie.elastic.layout", &root_h, 1, ncclUint64, 0, COLLIE_WORLD));
  if (rc) return rc;
  int32_t differs = root_h != h;
  rc = wait_op(collie_allreduce_async("collie.elastic.layout_ok", &differs, &differs, 1, ncclInt32, COLLIE_MAX, 1.0,
                                      1.0, COLLIE_WORLD));
  if (rc) return rc;
  if (differs)
    return el_fail(COLLIE_ERR_MISMATCH,
                   "collie_elastic_state_sync: workers registered different state (names, sizes or order differ "
                   "from rank 0's)");
  for (int i = 0; i < E.nst; i++) {
    if (!E.st[i].bytes) continue;
    char name[EL_NAME_MAX + 32];
    snprintf(name, sizeof(name), "collie.elastic.state.%s", E.st[i].name);
    rc = wait_op(collie_broadcast_async(name, E.st[i].ptr, E.st[i].bytes, ncclUint8, 0, COLLIE_WORLD));
    if (rc) return rc;
  }
  return collie_elastic_state_commit();
}

COLLIE_EXPORT int collie_elastic_check(void) {
  if (!E.initialized || !E.engine_up)
    return el_fail(COLLIE_ERR_NOT_INITIALIZED, "collie_elastic_check: collie_elastic_init first");
  static struct reply r;
  int32_t change = 0;
  int rc = call_u32(EREQ_HEARTBEAT, E.epoch, &r);
  if (rc) return rc;
  if (r.status == ESTATUS_OK) {
    uint32_t epoch = ebuf_get_u32(&r.in), pending = ebuf_get_u32(&r.in);
    change = epoch != E.epoch || pending != 0;
  } else {
    change = 1; /* the job failed: everyone goes to the rendezvous and learns why */
  }
  rc = wait_op(collie_allreduce_async("collie.elastic.check", &change, &change, 1, ncclInt32, COLLIE_MAX, 1.0, 1.0,
                                      COLLIE_WORLD));
  if (rc) return rc == COLLIE_ERR_SHUTDOWN ? COLLIE_ERR_COMMUNICATION : rc;
  if (change) {
    E.clean_change = 1;
    INFO(LOG_INIT, "elastic: membership change seen in epoch %u", E.epoch);
    return COLLIE_ERR_MEMBERSHIP;
  }
  return 0;
}

COLLIE_EXPORT int collie_elastic_reset(void) {
  if (!E.initialized) return el_fail(COLLIE_ERR_NOT_INITIALIZED, "collie_elastic_reset: collie_elastic_init first");
  INFO(LOG_INIT, "elastic: worker %u resets (epoch %u)", E.worker_id, E.epoch);
  /* Unless every rank agreed on a membership change at the same step, some
   * rank may still be inside an operation: abort rather than destroy. */
  teardown_world(!E.clean_change || comm_broken());
  E.clean_change = 0;
  return build_world(1);
}

COLLIE_EXPORT int collie_elastic_worker_id(void) {
  return E.initialized ? (int)E.worker_id : COLLIE_ERR_NOT_INITIALIZED;
}
COLLIE_EXPORT int collie_elastic_epoch(void) { return E.initialized ? (int)E.epoch : COLLIE_ERR_NOT_INITIALIZED; }
COLLIE_EXPORT int collie_elastic_resets(void) { return E.initialized ? (int)E.resets : COLLIE_ERR_NOT_INITIALIZED; }
COLLIE_EXPORT ncclComm_t collie_elastic_comm(void) { return E.initialized ? E.comm : NULL; }
