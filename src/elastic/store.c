/* The elastic rendezvous store (see store.h): one thread, one poll loop over
 * the listener and every connection. A worker's connection is its identity:
 * it registers once and every later request speaks for that worker; when the
 * connection closes without a LEAVE, or stays silent past the heartbeat
 * timeout, the worker is dead. Epochs form when every live worker has asked
 * for the next one (or the round times out); rank order is registration order. */
#include "elastic/store.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core.h"

#define STORE_MAX_CONNS 1024
/* Workers ever registered; beyond this the store refuses, so a registration
 * loop cannot grow its memory without bound. */
#define STORE_MAX_WORKERS_TOTAL 65536
#define STORE_TICK_MS 100
#define STORE_SEND_MS 2000

struct sconn {
  int fd;
  int worker; /* index into workers, -1 until REGISTER */
  int64_t deadline_ms; /* -1: none */
  union sock_addr from;
  uint8_t hdr_buf[EPROTO_HDR_BYTES];
  size_t hdr_got;
  int have_hdr;
  struct eproto_hdr hdr;
  uint8_t payload[EPROTO_MAX_REQUEST];
  size_t pay_got;
};

struct sworker {
  uint32_t id; /* 1-based, registration order */
  int alive, left, arrived, in_plan;
  int conn; /* index into conns, -1 once gone */
  int pid;
  int64_t last_seen_ms;
  char key[EPROTO_MAX_KEY + 1];
  char host[EPROTO_MAX_KEY + 1];
};

struct skey {
  char key[EPROTO_MAX_KEY + 1];
  int failures;
};

struct store {
  struct store_opts o;
  char prefix[64];
  int lfd, wake_fd;
  pthread_t thr;
  int thr_started;
  pthread_mutex_t mu; /* held by the thread while it handles events */
  int stop;
  struct sconn conns[STORE_MAX_CONNS];
  int nconns;
  struct sworker* w;
  int nw, capw;
  struct skey* keys;
  int nkeys, capkeys;
  uint32_t epoch, resets;
  int* plan; /* worker indices of the current epoch, rank order */
  int plan_n;
  uint8_t uid[EPROTO_UID_BYTES];
  int uid_set;
  int64_t last_register_ms, round_start_ms;
  int failed;
  char fail_msg[512];
};

__attribute__((format(printf, 2, 3))) static void event(struct store* s, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (s->o.log_prefix)
    fprintf(stderr, "%s: %s\n", s->prefix, buf);
  else
    INFO(LOG_INIT, "elastic store: %s", buf);
}

static void job_fail(struct store* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void job_fail(struct store* s, const char* fmt, ...) {
  if (s->failed) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->fail_msg, sizeof(s->fail_msg), fmt, ap);
  va_end(ap);
  s->failed = 1;
  event(s, "job failed: %s", s->fail_msg);
}

static struct skey* key_find(struct store* s, const char* key, int create) {
  for (int i = 0; i < s->nkeys; i++)
    if (strcmp(s->keys[i].key, key) == 0) return &s->keys[i];
  if (!create) return NULL;
  if (s->nkeys == s->capkeys) {
    int cap = s->capkeys ? 2 * s->capkeys : 16;
    struct skey* k = realloc(s->keys, (size_t)cap * sizeof(*k));
    if (!k) return NULL;
    s->keys = k;
    s->capkeys = cap;
  }
  struct skey* k = &s->keys[s->nkeys++];
  memset(k, 0, sizeof(*k));
  snprintf(k->key, sizeof(k->key), "%s", key);
  return k;
}

static int key_excluded(struct store* s, const char* key) {
  struct skey* k = key_find(s, key, 0);
  return k && s->o.slot_fail_limit > 0 && k->failures >= s->o.slot_fail_limit;
}

/* ---- membership ---------------------------------------------------------- */

static int change_pending(struct store* s) {
  if (s->epoch == 0) return 0;
  for (int i = 0; i < s->nw; i++) {
    struct sworker* w = &s->w[i];
    if (w->in_plan && ((!w->alive && !w->left) || w->arrived)) return 1;
    if (!w->in_plan && w->alive && !w->left && w->arrived && s->plan_n < s->o.max) return 1;
  }
  return 0;
}

/* The current epoch can no longer build or run its communicator: a member
 * died or went back to the rendezvous. (A newcomer waiting to join is a
 * pending change, not a broken epoch.) */
static int epoch_broken(struct store* s) {
  if (s->epoch == 0) return 0;
  for (int i = 0; i < s->nw; i++) {
    struct sworker* w = &s->w[i];
    if (w->in_plan && ((!w->alive && !w->left) || w->arrived)) return 1;
  }
  return 0;
}

static void form_epoch(struct store* s) {
  int n = 0;
  for (int i = 0; i < s->nw; i++) s->w[i].in_plan = 0;
  for (int i = 0; i < s->nw && n < s->o.max; i++) {
    struct sworker* w = &s->w[i];
    if (w->alive && !w->left && w->arrived) {
      s->plan[n++] = i;
      w->in_plan = 1;
      w->arrived = 0;
    }
  }
  s->plan_n = n;
  s->epoch++;
  s->uid_set = 0;
  s->round_start_ms = 0;
  if (s->epoch > 1) s->resets++;
  char ids[512];
  size_t off = 0;
  ids[0] = '\0';
  for (int r = 0; r < n && off < sizeof(ids) - 16; r++)
    off += (size_t)snprintf(ids + off, sizeof(ids) - off, "%s%u", r ? "," : "", s->w[s->plan[r]].id);
  if (n > 0 && off >= sizeof(ids) - 16) snprintf(ids + off, sizeof(ids) - off, ",...");
  event(s, "epoch %u: %d workers [%s] (worker ids in rank order; reset %u)", s->epoch, n, ids, s->resets);
  if (s->o.reset_limit >= 0 && s->resets > (uint32_t)s->o.reset_limit)
    job_fail(s, "reset limit reached: the membership changed %u times, more than the limit of %d "
                "(--reset-limit / COLLIE_ELASTIC_RESET_LIMIT)",
             s->resets, s->o.reset_limit);
}

/* Decides whether the waiting workers make the next epoch now. */
static void try_form(struct store* s, int64_t now) {
  if (s->failed) return;
  int cand = 0, stragglers = 0, real = 0, members = 0;
  for (int i = 0; i < s->nw; i++) {
    struct sworker* w = &s->w[i];
    if (w->in_plan && w->alive && !w->left) members++;
    if (w->alive && !w->left) {
      if (w->arrived)
        cand++;
      else
        stragglers++;
    }
    /* A round is real once a member asks for it or dies; a worker that only
     * wants to join waits until the members notice (collie_elastic_check). */
    if (w->in_plan && (w->arrived || (!w->alive && !w->left))) real = 1;
  }
  /* Nobody left of the current epoch: newcomers start the next one. */
  if (s->epoch == 0 || members == 0) real = real || cand > 0;
  if (!real) {
    s->round_start_ms = 0;
    return;
  }
  if (s->round_start_ms == 0) s->round_start_ms = now;
  int timed_out = now - s->round_start_ms >= s->o.rdzv_timeout_ms;
  if (stragglers > 0 && !timed_out) return;
  if (cand >= s->o.max) {
    form_epoch(s);
  } else if (cand >= s->o.min) {
    int settled = now - s->last_register_ms >= s->o.settle_ms;
    if ((s->epoch == 0 && s->o.expect > 0 && cand >= s->o.expect) || settled || timed_out) form_epoch(s);
  } else if (timed_out) {
    job_fail(s, "rendezvous timed out after %lld s with %d live worker(s) ready; at least %d needed (--min)",
             (long long)(s->o.rdzv_timeout_ms / 1000), cand, s->o.min);
  }
}

static void worker_gone(struct store* s, int wi, const char* why) {
  struct sworker* w = &s->w[wi];
  if (!w->alive) return;
  w->alive = 0;
  w->conn = -1;
  w->arrived = 0;
  if (w->left) {
    event(s, "worker %u (slot %s) left", w->id, w->key);
    return;
  }
  struct skey* k = key_find(s, w->key, 1);
  int fails = k ? ++k->failures : 0;
  event(s, "worker %u (slot %s, host %s, pid %d) lost: %s%s", w->id, w->key, w->host, w->pid, why,
        w->in_plan ? "; its epoch must re-form" : "");
  if (k && s->o.slot_fail_limit > 0 && fails == s->o.slot_fail_limit)
    event(s, "slot %s excluded: it failed %d times (limit %d)", w->key, fails, s->o.slot_fail_limit);
}

/* ---- connections --------------------------------------------------------- */

static void conn_drop(struct store* s, int ci, const char* why) {
  struct sconn* c = &s->conns[ci];
  char a[SOCK_ADDR_STRLEN];
  if (c->worker >= 0) {
    worker_gone(s, c->worker, why);
  } else if (why) {
    WARN("elastic store: dropped a connection from %s: %s", sock_addr_str(&c->from, a, sizeof(a)), why);
  }
  close(c->fd);
  /* Keep indices of the workers' connections valid: move the last one here. */
  int last = --s->nconns;
  if (ci != last) {
    s->conns[ci] = s->conns[last];
    if (s->conns[ci].worker >= 0) s->w[s->conns[ci].worker].conn = ci;
  }
}

static int reply(struct store* s, int ci, uint32_t seq, const uint8_t* payload, size_t len) {
  uint8_t buf[EPROTO_HDR_BYTES + EPROTO_MAX_REPLY];
  if (len > EPROTO_MAX_REPLY) return -1;
  eproto_encode_hdr(buf, EREPLY, (uint32_t)len, seq, s->o.secret);
  memcpy(buf + EPROTO_HDR_BYTES, payload, len);
  return sock_send_all(s->conns[ci].fd, buf, EPROTO_HDR_BYTES + len, time_ms() + STORE_SEND_MS, NULL) == SOCK_OK
             ? 0
             : -1;
}

static void put_text(struct ebuf* b, uint32_t status, const char* text) {
  ebuf_put_u32(b, status);
  ebuf_put_str(b, text, EPROTO_MAX_TEXT);
}

static void put_plan(struct store* s, struct ebuf* b, int wi) {
  int rank = -1;
  for (int r = 0; r < s->plan_n; r++)
    if (s->plan[r] == wi) rank = r;
  ebuf_put_u32(b, ESTATUS_OK);
  ebuf_put_u32(b, s->epoch);
  ebuf_put_u32(b, (uint32_t)rank);
  ebuf_put_u32(b, (uint32_t)s->plan_n);
  ebuf_put_u32(b, s->resets);
  for (int r = 0; r < s->plan_n; r++) ebuf_put_u32(b, s->w[s->plan[r]].id);
}

/* Handles one authenticated request; returns -1 to drop the connection. */
static int handle(struct store* s, int ci, int64_t now) {
  struct sconn* c = &s->conns[ci];
  static uint8_t out[EPROTO_MAX_REPLY]; /* the store thread is the only user */
  struct ebuf in, b;
  ebuf_reader(&in, c->payload, c->hdr.len);
  ebuf_writer(&b, out, sizeof(out));
  int type = c->hdr.type;
  uint32_t seq = c->hdr.seq;
  char why[128];

  if (type == EREQ_REGISTER) {
    char key[EPROTO_MAX_KEY + 1], host[EPROTO_MAX_KEY + 1];
    uint32_t pid = ebuf_get_u32(&in);
    ebuf_get_str(&in, key, sizeof(key), EPROTO_MAX_KEY);
    ebuf_get_str(&in, host, sizeof(host), EPROTO_MAX_KEY);
    if (!ebuf_done(&in) || c->worker >= 0) {
      snprintf(why, sizeof(why), c->worker >= 0 ? "registered twice" : "malformed REGISTER");
      goto bad;
    }
    if (s->failed) {
      put_text(&b, ESTATUS_FAIL, s->fail_msg);
    } else if (key_excluded(s, key)) {
      char msg[EPROTO_MAX_KEY + 128];
      snprintf(msg, sizeof(msg), "slot %s is excluded: it failed %d times (limit %d)", key,
               key_find(s, key, 0)->failures, s->o.slot_fail_limit);
      event(s, "refused a worker: %s", msg);
      put_text(&b, ESTATUS_EXCLUDED, msg);
    } else if (s->nw >= STORE_MAX_WORKERS_TOTAL) {
      put_text(&b, ESTATUS_REFUSED, "too many registrations");
    } else {
      if (s->nw == s->capw) {
        int cap = s->capw ? 2 * s->capw : 16;
        struct sworker* nw = realloc(s->w, (size_t)cap * sizeof(*nw));
        if (!nw) return -1;
        s->w = nw;
        s->capw = cap;
      }
      struct sworker* w = &s->w[s->nw];
      memset(w, 0, sizeof(*w));
      w->id = (uint32_t)s->nw + 1;
      w->alive = 1;
      w->conn = ci;
      w->pid = (int)pid;
      w->last_seen_ms = now;
      snprintf(w->key, sizeof(w->key), "%s", key);
      snprintf(w->host, sizeof(w->host), "%s", host);
      c->worker = s->nw++;
      c->deadline_ms = -1;
      s->last_register_ms = now;
      event(s, "worker %u registered (slot %s, host %s, pid %d)", w->id, w->key, w->host, w->pid);
      ebuf_put_u32(&b, ESTATUS_OK);
      ebuf_put_u32(&b, w->id);
      ebuf_put_u32(&b, s->epoch);
    }
    return reply(s, ci, seq, out, b.len);
  }

  if (c->worker < 0) {
    snprintf(why, sizeof(why), "request type %d before REGISTER", type);
    goto bad;
  }
  int wi = c->worker;
  struct sworker* w = &s->w[wi];
  w->last_seen_ms = now;

  switch (type) {
    case EREQ_RDZV: {
      uint32_t last = ebuf_get_u32(&in);
      if (!ebuf_done(&in)) {
        snprintf(why, sizeof(why), "malformed RDZV");
        goto bad;
      }
      if (!s->failed && !(w->in_plan && last < s->epoch && !w->arrived)) {
        w->arrived = 1;
        try_form(s, now);
      }
      if (s->failed)
        put_text(&b, ESTATUS_FAIL, s->fail_msg);
      else if (w->in_plan && last < s->epoch && !w->arrived)
        put_plan(s, &b, wi);
      else
        ebuf_put_u32(&b, ESTATUS_WAIT);
      break;
    }
    case EREQ_PUBLISH: {
      uint32_t ep = ebuf_get_u32(&in);
      uint8_t uid[EPROTO_UID_BYTES];
      ebuf_get_bytes(&in, uid, sizeof(uid));
      if (!ebuf_done(&in)) {
        snprintf(why, sizeof(why), "malformed PUBLISH");
        goto bad;
      }
      if (s->failed) {
        put_text(&b, ESTATUS_FAIL, s->fail_msg);
      } else if (ep != s->epoch || !w->in_plan || w->arrived) {
        ebuf_put_u32(&b, ESTATUS_STALE);
      } else if (s->plan_n == 0 || s->plan[0] != wi) {
        put_text(&b, ESTATUS_REFUSED, "only rank 0 of an epoch publishes its unique ID");
      } else {
        memcpy(s->uid, uid, sizeof(uid));
        s->uid_set = 1;
        ebuf_put_u32(&b, ESTATUS_OK);
      }
      break;
    }
    case EREQ_GET_UID: {
      uint32_t ep = ebuf_get_u32(&in);
      if (!ebuf_done(&in)) {
        snprintf(why, sizeof(why), "malformed GET_UID");
        goto bad;
      }
      if (s->failed) {
        put_text(&b, ESTATUS_FAIL, s->fail_msg);
      } else if (ep != s->epoch || !w->in_plan || w->arrived || s->plan_n == 0 || !s->w[s->plan[0]].alive ||
                 s->w[s->plan[0]].arrived) {
        /* Superseded, or rank 0 is gone or back at the rendezvous: it will
         * never publish, so everyone goes back there too. */
        ebuf_put_u32(&b, ESTATUS_STALE);
      } else if (!s->uid_set) {
        ebuf_put_u32(&b, ESTATUS_WAIT);
      } else {
        ebuf_put_u32(&b, ESTATUS_OK);
        ebuf_put_bytes(&b, s->uid, sizeof(s->uid));
      }
      break;
    }
    case EREQ_HEARTBEAT: {
      (void)ebuf_get_u32(&in);
      if (!ebuf_done(&in)) {
        snprintf(why, sizeof(why), "malformed HEARTBEAT");
        goto bad;
      }
      if (s->failed) {
        put_text(&b, ESTATUS_FAIL, s->fail_msg);
      } else {
        ebuf_put_u32(&b, ESTATUS_OK);
        ebuf_put_u32(&b, s->epoch);
        ebuf_put_u32(&b, (uint32_t)change_pending(s));
        ebuf_put_u32(&b, (uint32_t)epoch_broken(s));
      }
      break;
    }
    case EREQ_LEAVE:
      if (!ebuf_done(&in)) {
        snprintf(why, sizeof(why), "malformed LEAVE");
        goto bad;
      }
      w->left = 1;
      w->arrived = 0;
      ebuf_put_u32(&b, ESTATUS_OK);
      break;
    default:
      snprintf(why, sizeof(why), "unexpected request type %d", type);
      goto bad;
  }
  return reply(s, ci, seq, out, b.len);

bad:
  WARN("elastic store: dropping a connection: %s", why);
  return -1;
}

/* Reads what the connection has; handles complete requests. -1: drop it. */
static int conn_read(struct store* s, int ci, int64_t now, char* why, size_t why_len) {
  for (;;) {
    struct sconn* c = &s->conns[ci];
    if (!c->have_hdr) {
      size_t before = c->hdr_got;
      int st = sock_recv_some(c->fd, c->hdr_buf, EPROTO_HDR_BYTES, &c->hdr_got);
      /* A message has begun: it must finish within the handshake time. */
      if (before == 0 && c->hdr_got > 0 && c->deadline_ms < 0) c->deadline_ms = now + s->o.handshake_ms;
      if (st == SOCK_AGAIN) return 0;
      if (st == SOCK_CLOSED) {
        snprintf(why, why_len, c->hdr_got ? "closed inside a message" : "connection closed");
        return -1;
      }
      if (st != SOCK_OK) {
        snprintf(why, why_len, "socket error: %s", strerror(errno));
        return -1;
      }
      int v = eproto_decode_hdr(c->hdr_buf, s->o.secret, EPROTO_MAX_REQUEST, 0, &c->hdr);
      if (v != EPROTO_OK) {
        snprintf(why, why_len, "%s", eproto_verdict_str(v));
        return -1;
      }
      c->have_hdr = 1;
      c->pay_got = 0;
    }
    if (c->hdr.len > 0) {
      int st = sock_recv_some(c->fd, c->payload, c->hdr.len, &c->pay_got);
      if (st == SOCK_AGAIN) return 0;
      if (st != SOCK_OK) {
        snprintf(why, why_len, "%s inside a message", sock_status_str(st));
        return -1;
      }
    }
    c->have_hdr = 0;
    c->hdr_got = 0;
    /* A registered worker's message is complete; REGISTER clears it itself. */
    if (c->worker >= 0) c->deadline_ms = -1;
    if (handle(s, ci, now) != 0) {
      snprintf(why, why_len, "request refused or reply failed");
      return -1;
    }
  }
}

static void accept_all(struct store* s, int64_t now) {
  for (;;) {
    int fd;
    union sock_addr from;
    if (sock_accept(s->lfd, &fd, &from) != SOCK_OK) return;
    if (s->nconns == STORE_MAX_CONNS) {
      char a[SOCK_ADDR_STRLEN];
      WARN("elastic store: %d connections open; refusing %s", STORE_MAX_CONNS, sock_addr_str(&from, a, sizeof(a)));
      close(fd);
      continue;
    }
    struct sconn* c = &s->conns[s->nconns++];
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->worker = -1;
    c->from = from;
    c->deadline_ms = now + s->o.handshake_ms;
  }
}

static void timers(struct store* s, int64_t now) {
  for (int ci = 0; ci < s->nconns;) {
    struct sconn* c = &s->conns[ci];
    if (c->deadline_ms >= 0 && now >= c->deadline_ms) {
      conn_drop(s, ci, c->worker >= 0 ? "a message did not arrive in time" : "no valid request in time");
      continue;
    }
    if (c->worker >= 0 && s->o.hb_timeout_ms > 0 && !s->w[c->worker].left &&
        now - s->w[c->worker].last_seen_ms > s->o.hb_timeout_ms) {
      conn_drop(s, ci, "no heartbeat in time");
      continue;
    }
    ci++;
  }
  try_form(s, now);
}

static void* store_main(void* arg) {
  struct store* s = arg;
  struct pollfd pfd[STORE_MAX_CONNS + 2];
  for (;;) {
    pthread_mutex_lock(&s->mu);
    int stop = s->stop;
    int n = 0;
    pfd[n++] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
    for (int i = 0; i < s->nconns; i++) pfd[n++] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
    pthread_mutex_unlock(&s->mu);
    if (stop) break;

    int rc = poll(pfd, (nfds_t)n, STORE_TICK_MS);
    if (rc < 0 && errno != EINTR) {
      WARN("elastic store: poll: %s", strerror(errno));
      usleep(STORE_TICK_MS * 1000);
    }
    pthread_mutex_lock(&s->mu);
    int64_t now = time_ms();
    if (rc > 0) {
      /* Connections first, by fd (indices move when one is dropped). */
      for (int k = 2; k < n; k++) {
        if (!pfd[k].revents) continue;
        int ci = -1;
        for (int i = 0; i < s->nconns; i++)
          if (s->conns[i].fd == pfd[k].fd) ci = i;
        if (ci < 0) continue;
        char why[160];
        if (conn_read(s, ci, now, why, sizeof(why)) != 0) conn_drop(s, ci, why);
      }
      if (pfd[1].revents) accept_all(s, now);
    }
    timers(s, now);
    pthread_mutex_unlock(&s->mu);
  }
  return NULL;
}

ncclResult_t store_start(const struct store_opts* o, struct store** out) {
  *out = NULL;
  if (o->min < 1 || o->max < o->min || o->max > EPROTO_MAX_WORKERS)
    return err_set(ncclInvalidArgument, "elastic store: need 1 <= min (%d) <= max (%d) <= %d", o->min, o->max,
                   EPROTO_MAX_WORKERS);
  struct store* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "elastic store: out of memory");
  ncclResult_t res = ncclSuccess;
  s->o = *o;
  snprintf(s->prefix, sizeof(s->prefix), "%s", o->log_prefix ? o->log_prefix : "");
  s->o.log_prefix = o->log_prefix ? s->prefix : NULL;
  if (s->o.handshake_ms <= 0) s->o.handshake_ms = 5000;
  s->lfd = -1;
  s->wake_fd = -1;
  pthread_mutex_init(&s->mu, NULL);
  s->plan = calloc((size_t)o->max, sizeof(int));
  if (!s->plan) {
    res = err_set(ncclSystemError, "elastic store: out of memory");
    goto fail;
  }
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd < 0) {
    res = err_set(ncclSystemError, "elastic store: eventfd: %s", strerror(errno));
    goto fail;
  }
  NCCLCHECKGOTO(sock_listen(&s->o.bind, &s->lfd), res, fail);
  s->last_register_ms = time_ms();
  if (pthread_create(&s->thr, NULL, store_main, s) != 0) {
    res = err_set(ncclSystemError, "elastic store: cannot start its thread");
    goto fail;
  }
  s->thr_started = 1;
  *out = s;
  return ncclSuccess;
fail:
  store_stop(s);
  return res;
}

void store_address(struct store* s, union sock_addr* out) { *out = s->o.bind; }

int store_failed(struct store* s, char* msg, size_t n) {
  pthread_mutex_lock(&s->mu);
  int f = s->failed;
  if (f && msg) snprintf(msg, n, "%s", s->fail_msg);
  pthread_mutex_unlock(&s->mu);
  return f;
}

void store_progress(struct store* s, uint32_t* epoch, uint32_t* resets) {
  pthread_mutex_lock(&s->mu);
  if (epoch) *epoch = s->epoch;
  if (resets) *resets = s->resets;
  pthread_mutex_unlock(&s->mu);
}

void store_counts(struct store* s, int* registered, int* live) {
  pthread_mutex_lock(&s->mu);
  int n = 0;
  for (int i = 0; i < s->nw; i++) n += s->w[i].alive && !s->w[i].left;
  *registered = s->nw;
  *live = n;
  pthread_mutex_unlock(&s->mu);
}

void store_stop(struct store* s) {
  if (!s) return;
  if (s->thr_started) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof(one)) < 0) { /* the 100 ms tick notices the flag anyway */
    }
    pthread_join(s->thr, NULL);
  }
  for (int i = 0; i < s->nconns; i++) close(s->conns[i].fd);
  if (s->lfd >= 0) close(s->lfd);
  if (s->wake_fd >= 0) close(s->wake_fd);
  pthread_mutex_destroy(&s->mu);
  free(s->plan);
  free(s->w);
  free(s->keys);
  free(s);
}
