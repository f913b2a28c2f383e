/* The bootstrap root: one thread per unique ID, started by ncclGetUniqueId
 * (or by rank 0 in NCCL_COMM_ID mode). It accepts check-ins from its block of
 * ranks concurrently (one poll loop, per-connection handshake deadlines, so a
 * stalled or hostile connection delays nobody), then hands its block's
 * address table to the block's first rank and tells every other rank where
 * its ring successor listens, or tells every waiting rank which ranks never came. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core.h"
#include "bootstrap.h"
#include "conn.h"

struct root_slot {
  int fd;  /* held open until the reply; -1 when absent */
  union sock_addr addr;
  uint8_t* card; /* what the rank sent after its check-in (bootstrap_init's card) */
  uint32_t card_len;
};

struct root {
  struct root* next;
  pid_t owner;
  pthread_t thread;
  int done; /* atomic: the thread has finished */
  int stop; /* atomic: asked to stop (process exit) */
  int wake[2];
  int listen_fd;
  struct bootstrap_id id;
  int started_by_init;
  /* Read from the environment by root_start, on the caller's thread: the root
   * thread never calls getenv (another thread may be calling setenv). */
  int64_t timeout_ms, handshake_ms;
  /* Learned from the first valid check-in. */
  int nranks, nroots, index, first, count, next_first;
  struct root_slot* slots;
  union sock_addr next_addr;
  int have_next;
  int arrived;
  struct conn_reader* pending;
  int npending, cap_pending;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork() in a threaded process: never let a child inherit this lock held. */
static void registry_lock_prepare(void) { pthread_mutex_lock(&registry_lock); }
static void registry_lock_release(void) { pthread_mutex_unlock(&registry_lock); }
__attribute__((constructor)) static void registry_lock_atfork(void) {
  pthread_atfork(registry_lock_prepare, registry_lock_release, registry_lock_release);
}
static struct root* registry;

int root_test_reply_delay_ms;

/* Largest check-in frame the root reads (the check-in itself is CHECKIN_BYTES). */
#define ROOT_MAX_FRAME 4096

static int block_first(int k, int nranks, int nroots) { return (int)((int64_t)k * nranks / nroots); }

/* For FRAME_ROOT_ERROR the tag carries the ncclResult_t the rank returns.
 * Header and payload go out in one send where they fit in a small buffer, so a
 * rank never reads a reply's header without the rest being on its way. A
 * failure is logged (the rank reports its side). */
static void root_send(struct root* r, int fd, int type, uint32_t tag, const void* payload, uint32_t len,
                      int64_t deadline) {
  struct frame_hdr h;
  uint8_t buf[FRAME_HDR_BYTES + 512];
  frame_init(&h, type, len, -1, tag, r->id.secret);
  frame_encode(&h, buf);
  int st;
  if (len <= sizeof(buf) - FRAME_HDR_BYTES) {
    if (len) memcpy(buf + FRAME_HDR_BYTES, payload, len);
    st = sock_send_all(fd, buf, FRAME_HDR_BYTES + len, deadline, NULL);
  } else {
    st = sock_send_all(fd, buf, FRAME_HDR_BYTES, deadline, NULL);
    if (st == SOCK_OK) st = sock_send_all(fd, payload, len, deadline, NULL);
  }
  if (st != SOCK_OK) {
    char a[SOCK_ADDR_STRLEN];
    WARN("bootstrap root %s: a %u-byte reply was not delivered: %s", sock_addr_str(&r->id.root, a, sizeof(a)), len,
         sock_status_str(st));
  }
}

/* Replies to a check-in that cannot be accepted, then drops it. */
static void root_reject(struct root* r, struct conn_reader* c, const char* why) {
  char a[SOCK_ADDR_STRLEN], b[SOCK_ADDR_STRLEN];
  WARN("bootstrap root %s: rejected a check-in from %s: %s", sock_addr_str(&r->id.root, a, sizeof(a)),
       sock_addr_str(&c->from, b, sizeof(b)), why);
  root_send(r, c->fd, FRAME_ROOT_ERROR, ncclInvalidUsage, why, (uint32_t)strlen(why) + 1, time_ms() + 1000);
  conn_close(c);
}

/* Takes one complete, authenticated check-in. Returns 1 if it kept the fd. */
static int root_checkin(struct root* r, struct conn_reader* c, const uint8_t* payload) {
  struct checkin ci;
  char why[256];
  if (c->hdr.type != FRAME_CHECKIN) {
    bootstrap_note_dropped(&c->from, "root", "first frame is not a check-in");
    return 0;
  }
  if (c->hdr.len > CHECKIN_BYTES + CHECKIN_CARD_MAX) {
    bootstrap_note_dropped(&c->from, "root", "check-in card too long");
    return 0;
  }
  uint32_t card_len = c->hdr.len > CHECKIN_BYTES ? c->hdr.len - CHECKIN_BYTES : 0;
  if (checkin_decode(payload, c->hdr.len - card_len, &ci, why, sizeof(why)) != 0) {
    bootstrap_note_dropped(&c->from, "root", why);
    return 0;
  }
  if (ci.nonce != r->id.nonce) {
    bootstrap_note_dropped(&c->from, "root", "check-in for another unique ID");
    return 0;
  }
  if (r->nranks == 0) {
    r->nranks = ci.nranks;
    r->nroots = ci.nroots;
    r->index = ci.root_index;
    r->first = block_first(r->index, r->nranks, r->nroots);
    r->count = block_first(r->index + 1, r->nranks, r->nroots) - r->first;
    r->next_first = block_first((r->index + 1) % r->nroots, r->nranks, r->nroots);
    r->slots = calloc((size_t)r->count, sizeof(*r->slots));
    if (!r->slots) {
      r->nranks = 0; /* the next check-in tries again rather than using no slots */
      bootstrap_note_dropped(&c->from, "root", "out of memory for the check-in table");
      return 0;
    }
    for (int i = 0; i < r->count; i++) r->slots[i].fd = -1;
  } else if (ci.nranks != r->nranks || ci.nroots != r->nroots || ci.root_index != r->index) {
    snprintf(why, sizeof(why),
             "rank %d was called with nranks=%d and %d unique IDs (root %d), but earlier ranks used "
             "nranks=%d with %d IDs (root %d)",
             ci.rank, ci.nranks, ci.nroots, ci.root_index, r->nranks, r->nroots, r->index);
    root_reject(r, c, why);
    return 1; /* root_reject closed it */
  }
  memcpy(&c->from, ci.addr, sizeof(ci.addr)); /* from now on: the rank's listener */
  if (ci.neighbor) {
    if (ci.rank != r->next_first || r->nroots == 1) {
      snprintf(why, sizeof(why), "unexpected neighbor check-in from rank %d", ci.rank);
      root_reject(r, c, why);
      return 1;
    }
    r->next_addr = c->from;
    r->have_next = 1;
    return 0;
  }
  if (ci.rank < r->first || ci.rank >= r->first + r->count) {
    snprintf(why, sizeof(why), "rank %d does not belong to root %d (ranks %d..%d)", ci.rank, r->index,
             r->first, r->first + r->count - 1);
    root_reject(r, c, why);
    return 1;
  }
  struct root_slot* s = &r->slots[ci.rank - r->first];
  if (s->fd >= 0) {
    snprintf(why, sizeof(why), "rank %d checked in twice (two processes were given the same rank?)", ci.rank);
    root_reject(r, c, why);
    return 1;
  }
  if (card_len) {
    s->card = malloc(card_len);
    if (!s->card) {
      bootstrap_note_dropped(&c->from, "root", "out of memory for a check-in card");
      return 0;
    }
    memcpy(s->card, payload + CHECKIN_BYTES, card_len);
    s->card_len = card_len;
  }
  s->fd = c->fd;
  s->addr = c->from;
  r->arrived++;
  if (ci.rank == r->next_first) {
    r->next_addr = c->from;
    r->have_next = 1;
  }
  c->fd = -1;
  return 1;
}

/* What one look at a pending connection did with it. */
enum { ROOT_PENDING = 0, ROOT_KEPT, ROOT_DROPPED };

/* Reads what a pending connection sent; a complete first frame is handled as
 * a check-in. ROOT_KEPT: the fd now belongs to a slot or was answered and
 * closed; ROOT_DROPPED: the caller closes it. */
static int root_service(struct root* r, struct conn_reader* c) {
  char why[256];
  int ev = conn_progress(c, r->id.secret, ROOT_MAX_FRAME, INT32_MAX, why, sizeof(why));
  if (ev == CONN_MSG) {
    uint8_t* payload = conn_take(c);
    int keep = root_checkin(r, c, payload);
    free(payload);
    return keep ? ROOT_KEPT : ROOT_DROPPED;
  }
  if (ev == CONN_BAD) {
    bootstrap_note_dropped(&c->from, "root", why);
    return ROOT_DROPPED;
  }
  if (ev == CONN_CLOSED) {
    bootstrap_note_dropped(&c->from, "root", "closed before sending a check-in");
    return ROOT_DROPPED;
  }
  return ROOT_PENDING;
}

/* The block's first rank gets the next block's first rank's address, then
 * its block's table (addresses, card lengths, cards: bootstrap.c's table
 * format) and spreads it through the ranks (bootstrap.c); it goes first so
 * the spreading starts at once. The others get their ring successor's
 * address, which also says "everyone is here". One table, not one per rank:
 * the root's work stays linear in the ranks. */
static void root_finish_ok(struct root* r) {
  int64_t deadline = time_ms() + 5000;
  size_t a = sizeof(union sock_addr), len = a + (a + 4) * (size_t)r->count;
  for (int i = 0; i < r->count; i++) len += r->slots[i].card_len;
  uint8_t* table = malloc(len);
  if (!table) {
    const char* msg = "bootstrap root: out of memory for the address table";
    WARN("%s", msg);
    for (int i = 0; i < r->count; i++)
      root_send(r, r->slots[i].fd, FRAME_ROOT_ERROR, ncclSystemError, msg, (uint32_t)strlen(msg) + 1, deadline);
    return;
  }
  uint8_t* p = table;
  memcpy(p, &r->next_addr, a);
  p += a;
  for (int i = 0; i < r->count; i++, p += a) memcpy(p, &r->slots[i].addr, a);
  for (int i = 0; i < r->count; i++, p += 4) memcpy(p, &r->slots[i].card_len, 4);
  for (int i = 0; i < r->count; i++) {
    if (r->slots[i].card_len) memcpy(p, r->slots[i].card, r->slots[i].card_len);
    p += r->slots[i].card_len;
  }
  root_send(r, r->slots[0].fd, FRAME_ROOT_REPLY, 0, table, (uint32_t)len, deadline);
  free(table);
  for (int i = 1; i < r->count; i++) {
    if (root_test_reply_delay_ms > 0) {
      struct timespec ts = {root_test_reply_delay_ms / 1000, (long)(root_test_reply_delay_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    const union sock_addr* succ = (i + 1 < r->count) ? &r->slots[i + 1].addr : &r->next_addr;
    root_send(r, r->slots[i].fd, FRAME_ROOT_REPLY, 0, succ, (uint32_t)a, deadline);
  }
}

static void free_slots(struct root* r) {
  for (int i = 0; r->slots && i < r->count; i++) free(r->slots[i].card);
  free(r->slots);
  r->slots = NULL;
}

static void root_finish_timeout(struct root* r, int64_t waited_ms) {
  char msg[512];
  size_t o = 0;
  int missing = 0;
  if (r->nranks == 0) return;
  o += (size_t)snprintf(msg + o, sizeof(msg) - o, "bootstrap: after %.1f s, ", waited_ms / 1000.0);
  for (int i = 0; i < r->count; i++) {
    if (r->slots[i].fd >= 0) continue;
    if (missing < 8 && o < sizeof(msg))
      o += (size_t)snprintf(msg + o, sizeof(msg) - o, "%srank %d", missing ? ", " : "", r->first + i);
    missing++;
  }
  if (!r->have_next && r->nroots > 1 && o < sizeof(msg)) {
    o += (size_t)snprintf(msg + o, sizeof(msg) - o, "%srank %d (the next root's first rank)",
                          missing ? ", " : "", r->next_first);
    missing++;
  }
  if (missing > 8 && o < sizeof(msg)) o += (size_t)snprintf(msg + o, sizeof(msg) - o, " and %d more", missing - 8);
  if (o < sizeof(msg))
    snprintf(msg + o, sizeof(msg) - o, " of %d ranks %s not checked in (COLLIE_BOOTSTRAP_TIMEOUT=%lld s)",
             r->nranks, missing == 1 ? "has" : "have", (long long)(r->timeout_ms / 1000));
  WARN("%s", msg);
  int64_t deadline = time_ms() + 1000;
  for (int i = 0; i < r->count; i++)
    if (r->slots[i].fd >= 0) root_send(r, r->slots[i].fd, FRAME_ROOT_ERROR, ncclRemoteError, msg, (uint32_t)strlen(msg) + 1, deadline);
}

static void* root_main(void* arg) {
  struct root* r = arg;
  int64_t timeout_ms = r->timeout_ms, handshake_ms = r->handshake_ms;
  int64_t start = time_ms();
  int64_t first_checkin = r->started_by_init ? start : -1;
  struct pollfd* pfds = NULL;
  int cap_pfds = 0;

  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    if (r->nranks && r->arrived == r->count && r->have_next) {
      root_finish_ok(r);
      break;
    }
    int64_t now = time_ms();
    if (first_checkin >= 0 && now - first_checkin >= timeout_ms) {
      root_finish_timeout(r, now - first_checkin);
      break;
    }
    int n = 2 + r->npending;
    if (n > cap_pfds) {
      cap_pfds = n * 2;
      struct pollfd* np = realloc(pfds, sizeof(*pfds) * (size_t)cap_pfds);
      if (!np) break;
      pfds = np;
    }
    pfds[0] = (struct pollfd){.fd = r->listen_fd, .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = r->wake[0], .events = POLLIN};
    int64_t wait = 1000;
    if (first_checkin >= 0) wait = COLLIE_MIN(wait, first_checkin + timeout_ms - now);
    for (int i = 0; i < r->npending; i++) {
      pfds[2 + i] = (struct pollfd){.fd = r->pending[i].fd, .events = POLLIN};
      wait = COLLIE_MIN(wait, r->pending[i].deadline_ms - now);
    }
    if (wait < 0) wait = 0;
    int rc = poll(pfds, (nfds_t)n, (int)wait);
    if (rc < 0 && errno != EINTR) break;
    now = time_ms();
    /* Progress pending connections first (pfds index i+2 maps to pending[i]). */
    for (int i = r->npending - 1; i >= 0; i--) {
      struct conn_reader* c = &r->pending[i];
      int drop = 0, keep = 0;
      if (rc > 0 && (pfds[2 + i].revents & (POLLIN | POLLHUP | POLLERR))) {
        int st = root_service(r, c);
        keep = st == ROOT_KEPT;
        drop = st == ROOT_DROPPED;
        if (keep && first_checkin < 0) first_checkin = now;
      }
      if (!drop && !keep && now >= c->deadline_ms) {
        bootstrap_note_dropped(&c->from, "root", "no valid check-in before the handshake deadline");
        drop = 1;
      }
      if (drop || keep) {
        if (drop) conn_close(c);
        r->pending[i] = r->pending[--r->npending];
      }
    }
    if (rc > 0 && (pfds[0].revents & POLLIN)) {
      for (;;) {
        int fd;
        union sock_addr from;
        if (sock_accept(r->listen_fd, &fd, &from) != SOCK_OK) break;
        if (r->npending == r->cap_pending) {
          int cap = r->cap_pending ? r->cap_pending * 2 : 64;
          struct conn_reader* np = realloc(r->pending, sizeof(*np) * (size_t)cap);
          if (!np) { close(fd); break; }
          r->pending = np;
          r->cap_pending = cap;
        }
        conn_reader_init(&r->pending[r->npending++], fd, &from, now + handshake_ms);
      }
    }
  }
  for (int i = 0; i < r->npending; i++) conn_close(&r->pending[i]);
  r->npending = 0;
  for (int i = 0; r->slots && i < r->count; i++)
    if (r->slots[i].fd >= 0) close(r->slots[i].fd);
  free(pfds);
  close(r->listen_fd);
  r->listen_fd = -1;
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void root_free(struct root* r) {
  free_slots(r);
  free(r->pending);
  close(r->wake[0]);
  close(r->wake[1]);
  free(r);
}

/* The root port a launcher bound for rank 0 and handed down
 * (COLLIE_BOOTSTRAP_ROOT_FD, set by collie-run in rank 0 alone): taken once
 * per process, and only if that descriptor is still a socket listening on
 * exactly the root address. A port merely named in NCCL_COMM_ID is free
 * for anyone until rank 0 binds it, which in a Python rank that first
 * imports torch is seconds later: two jobs started at once by a test had
 * one job's port taken by the other's listener, whose root dropped the
 * first job's check-ins as strangers ("lost the root ... connection closed
 * by peer", once in 50 DDP jobs). 1: *fd is the listener (non-blocking,
 * close-on-exec). */
static int reserved_taken;
static int take_reserved_listener(const union sock_addr* addr, int* fd) {
  const char* v = param_str(P_COLLIE_BOOTSTRAP_ROOT_FD);
  if (!v || !*v || __atomic_exchange_n(&reserved_taken, 1, __ATOMIC_ACQ_REL)) return 0;
  char* end;
  long n = strtol(v, &end, 10);
  if (*end || n < 3 || n > INT32_MAX || !sock_is_listener_on((int)n, addr)) {
    char a[SOCK_ADDR_STRLEN];
    INFO(LOG_BOOTSTRAP, "COLLIE_BOOTSTRAP_ROOT_FD=%s is not a listener on %s: binding the root port here", v,
         sock_addr_str(addr, a, sizeof(a)));
    return 0;
  }
  int flags = fcntl((int)n, F_GETFL);
  if (flags < 0 || fcntl((int)n, F_SETFL, flags | O_NONBLOCK) != 0 || fcntl((int)n, F_SETFD, FD_CLOEXEC) != 0)
    return 0;
  *fd = (int)n;
  INFO(LOG_BOOTSTRAP, "bootstrap root: using the listener the launcher bound (descriptor %d)", *fd);
  return 1;
}

ncclResult_t root_start(struct bootstrap_id* id, int started_by_init) {
  struct root* r = calloc(1, sizeof(*r));
  if (!r) return err_set(ncclSystemError, "out of memory starting the bootstrap root");
  r->id = *id;
  r->owner = getpid();
  r->started_by_init = started_by_init;
  r->timeout_ms = param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  r->handshake_ms = param_int(P_COLLIE_BOOTSTRAP_HANDSHAKE_TIMEOUT, 10, 3600000);
  union sock_addr addr = id->root;
  if (!started_by_init || !take_reserved_listener(&addr, &r->listen_fd)) {
    ncclResult_t res = sock_listen_on(&addr, (int)param_int(P_COLLIE_LISTEN_ANY, 0, 1), &r->listen_fd);
    if (res != ncclSuccess) {
      free(r);
      return res;
    }
  }
  if (pipe2(r->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(r->listen_fd);
    free(r);
    return err_set(ncclSystemError, "pipe2 failed: %s", strerror(errno));
  }
  r->id.root = addr;
  id->root = addr;
  int rc = pthread_create(&r->thread, NULL, root_main, r);
  if (rc != 0) {
    close(r->listen_fd);
    close(r->wake[0]);
    close(r->wake[1]);
    free(r);
    return err_set(ncclSystemError, "cannot start the bootstrap root thread: %s", strerror(rc));
  }
  pthread_mutex_lock(&registry_lock);
  r->next = registry;
  registry = r;
  pthread_mutex_unlock(&registry_lock);
  char a[SOCK_ADDR_STRLEN];
  INFO(LOG_BOOTSTRAP, "bootstrap root listening on %s", sock_addr_str(&addr, a, sizeof(a)));
  return ncclSuccess;
}

static void reap(int stop_all) {
  pid_t me = getpid();
  pthread_mutex_lock(&registry_lock);
  struct root** pp = &registry;
  struct root* mine = NULL;
  while (*pp) {
    struct root* r = *pp;
    if (r->owner == me && (stop_all || __atomic_load_n(&r->done, __ATOMIC_ACQUIRE))) {
      *pp = r->next;
      r->next = mine;
      mine = r;
    } else {
      pp = &r->next;
    }
  }
  pthread_mutex_unlock(&registry_lock);
  while (mine) {
    struct root* r = mine;
    mine = r->next;
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
    ssize_t w = write(r->wake[1], "x", 1);
    (void)w;
    pthread_join(r->thread, NULL);
    root_free(r);
  }
}

void root_reap(void) { reap(0); }

void root_wait_served(const struct bootstrap_id* id) {
  pid_t me = getpid();
  /* Its replies are under way (ours came first or earlier); each send has a
   * deadline of its own, so this is a bound, not a wait for other ranks. */
  int64_t until = time_ms() + 10000;
  for (;;) {
    int busy = 0;
    pthread_mutex_lock(&registry_lock);
    for (struct root* r = registry; r && !busy; r = r->next)
      busy = r->owner == me && r->id.nonce == id->nonce && !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&registry_lock);
    if (!busy || time_ms() > until) break;
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
  }
  reap(0);
}

__attribute__((destructor)) static void root_fini(void) { reap(1); }

/* ---------------------------------------------------------------- fuzzing */

/* A root without listener or thread, for tests/fuzz: the fuzzer hands it
 * connections (each an fd holding what a client sent) and the same code as
 * root_main's loop handles them. */
struct root* root_test_new(const struct bootstrap_id* id) {
  struct root* r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->id = *id;
  r->owner = getpid();
  r->timeout_ms = 1000;
  r->handshake_ms = 1000;
  r->listen_fd = -1;
  r->wake[0] = r->wake[1] = -1;
  return r;
}

int root_test_connection(struct root* r, int fd, const union sock_addr* from) {
  struct conn_reader c;
  conn_reader_init(&c, fd, from, time_ms() + r->handshake_ms);
  int st = root_service(r, &c);
  if (st != ROOT_KEPT) conn_close(&c); /* a connection still pending counts as past its deadline */
  return st;
}

int root_test_finish(struct root* r) {
  int ok = r->nranks && r->arrived == r->count && r->have_next;
  if (ok) root_finish_ok(r);
  else root_finish_timeout(r, r->timeout_ms);
  for (int i = 0; r->slots && i < r->count; i++)
    if (r->slots[i].fd >= 0) close(r->slots[i].fd);
  free_slots(r);
  free(r->pending);
  free(r);
  return ok;
}
