/* Rank side of the bootstrap: check-in with the root (with this rank's card),
 * spreading the root's table of addresses and cards down a tree, tagged
 * point-to-point messages over persistent authenticated connections, and the
 * allgather / barrier / broadcast built on them. Progress is made by whoever
 * is waiting (no extra thread): a send that would block also reads incoming
 * messages, so two ranks sending large messages to each other cannot deadlock.
 * Talks to root.c (check-in protocol) and socket.c / conn.c (I/O). */
#include "bootstrap.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../core.h"
#include "conn.h"

#define TAG_ALLGATHER (BOOTSTRAP_TAG_INTERNAL | 0x1000000u)
#define TAG_BARRIER (BOOTSTRAP_TAG_INTERNAL | 0x2000000u)
#define TAG_BCAST (BOOTSTRAP_TAG_INTERNAL | 0x3000000u)
#define TAG_TABLE (BOOTSTRAP_TAG_INTERNAL | 0x4000000u)
#define POLL_SLICE_MS 100

_Static_assert(sizeof(struct bootstrap_id) <= NCCL_UNIQUE_ID_BYTES, "bootstrap_id must fit a ncclUniqueId");

/* What every rank learns about every other at bootstrap: where it listens
 * (from the root's table) and, once the communicator's peer-info exchange
 * has run, its host name (bootstrap_set_peer_host; for messages only). */
struct peer_rec {
  union sock_addr addr;
  char host[64];
};

struct bs_msg {
  struct bs_msg* next;
  int32_t rank;
  uint32_t tag;
  uint32_t len;
  uint8_t* data;
};

struct bootstrap {
  int rank, nranks;
  uint8_t secret[FRAME_SECRET_BYTES];
  uint64_t nonce;
  volatile uint32_t* abort_flag;
  int64_t timeout_ms, handshake_ms;
  int listen_any; /* COLLIE_LISTEN_ANY, read at init for every listener of this communicator */
  int listen_fd;
  union sock_addr listen_addr;
  struct peer_rec* peers;
  int* out_fd;
  uint8_t* in_closed; /* the peer's connection to us ended */
  uint8_t* failed;    /* declared dead by the failure detector (atomic bytes) */
  struct conn_reader* in;
  int nin, cap_in;
  struct pollfd* pfds;
  int cap_pfds;
  struct bs_msg *qhead, *qtail;
  pthread_mutex_t lock;
  /* The owning communicator's stop condition (bootstrap_set_watch). */
  ncclResult_t (*stop)(void* arg);
  void* stop_arg;
  int wake_fd;
  double phase_ms[2]; /* bootstrap_init: check-in until the root's answer; spreading the address table */
  /* Every rank's card (bootstrap_init): card_len[i] bytes at cards + card_off[i]. */
  uint32_t* card_len;
  size_t* card_off;
  uint8_t* cards;
  size_t ncards, cap_cards;
};

/* How one call waits: watched calls also end on the communicator's stop
 * condition and sleep on its wake fd; control calls (shrink) do not. */
struct wopt {
  int watched;
  int64_t timeout_ms;
  int timed_out; /* out */
};
#define WOPT_DEFAULT(bs) ((struct wopt){1, (bs)->timeout_ms, 0})

static uint64_t dropped_count;

uint64_t bootstrap_dropped_count(void) { return __atomic_load_n(&dropped_count, __ATOMIC_RELAXED); }

void bootstrap_note_dropped(const union sock_addr* from, const char* where, const char* why) {
  char a[SOCK_ADDR_STRLEN];
  __atomic_add_fetch(&dropped_count, 1, __ATOMIC_RELAXED);
  WARN("bootstrap %s: dropped a connection from %s: %s", where, sock_addr_str(from, a, sizeof(a)), why);
}

void bootstrap_set_watch(struct bootstrap* bs, ncclResult_t (*stop)(void* arg), void* arg, int wake_fd) {
  bs->stop = stop;
  bs->stop_arg = arg;
  bs->wake_fd = wake_fd;
}

void bootstrap_peer_failed(struct bootstrap* bs, int peer) {
  if (bs && peer >= 0 && peer < bs->nranks) __atomic_store_n(&bs->failed[peer], 1, __ATOMIC_RELAXED);
}

int bootstrap_rank(const struct bootstrap* bs) { return bs->rank; }
int bootstrap_nranks(const struct bootstrap* bs) { return bs->nranks; }
uint64_t bootstrap_nonce(const struct bootstrap* bs) { return bs->nonce; }
int bootstrap_listen_any(const struct bootstrap* bs) { return bs->listen_any; }
const union sock_addr* bootstrap_peer_addr(const struct bootstrap* bs, int peer) {
  return &bs->peers[peer].addr;
}
void bootstrap_set_peer_host(struct bootstrap* bs, int peer, const char* host) {
  if (!bs || peer < 0 || peer >= bs->nranks || !host) return;
  snprintf(bs->peers[peer].host, sizeof(bs->peers[peer].host), "%s", host);
}
const uint8_t* bootstrap_card(const struct bootstrap* bs, int peer, uint32_t* len) {
  if (!bs || peer < 0 || peer >= bs->nranks || !bs->card_len[peer]) {
    *len = 0;
    return NULL;
  }
  *len = bs->card_len[peer];
  return bs->cards + bs->card_off[peer];
}
void bootstrap_phase_ms(const struct bootstrap* bs, double* checkin_ms, double* table_ms) {
  *checkin_ms = bs->phase_ms[0];
  *table_ms = bs->phase_ms[1];
}
const char* bootstrap_peer_host(const struct bootstrap* bs, int peer) {
  if (!bs || peer < 0 || peer >= bs->nranks || !bs->peers[peer].host[0]) return "unknown host";
  return bs->peers[peer].host;
}

/* ---------------------------------------------------------------- IDs */

static uint64_t fnv1a(uint64_t h, const char* s) {
  for (; s && *s; s++) {
    h ^= (uint8_t)*s;
    h *= 0x100000001b3ULL;
  }
  return h;
}

static int parse_hex_secret(const char* s, uint8_t out[FRAME_SECRET_BYTES]) {
  if (!s || strlen(s) != 2 * FRAME_SECRET_BYTES) return -1;
  for (int i = 0; i < FRAME_SECRET_BYTES; i++) {
    unsigned v;
    char pair[3] = {s[2 * i], s[2 * i + 1], 0};
    char* end;
    v = (unsigned)strtoul(pair, &end, 16);
    if (*end) return -1;
    out[i] = (uint8_t)v;
  }
  return 0;
}

static ncclResult_t random_bytes(void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t rc = getrandom((char*)buf + got, n - got, 0);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return err_set(ncclSystemError, "getrandom failed: %s", strerror(errno));
    }
    got += (size_t)rc;
  }
  return ncclSuccess;
}

ncclResult_t bootstrap_id_decode(const ncclUniqueId* uid, struct bootstrap_id* out) {
  memcpy(out, uid, sizeof(*out));
  if (out->magic != BOOTSTRAP_ID_MAGIC)
    return err_set(ncclInvalidArgument,
                   "the ncclUniqueId was not produced by collie's ncclGetUniqueId (bad magic 0x%08x); "
                   "every rank must receive the same ID, created by one process",
                   out->magic);
  if (out->version != BOOTSTRAP_ID_VERSION)
    return err_set(ncclInvalidArgument, "the ncclUniqueId has version %u; this collie speaks version %d",
                   out->version, BOOTSTRAP_ID_VERSION);
  if (!sock_addr_valid(&out->root))
    return err_set(ncclInvalidArgument, "the ncclUniqueId holds no valid root address");
  return ncclSuccess;
}

ncclResult_t bootstrap_id_from_addr(const union sock_addr* addr, ncclUniqueId* uid) {
  struct bootstrap_id id;
  memset(&id, 0, sizeof(id));
  id.magic = BOOTSTRAP_ID_MAGIC;
  id.version = BOOTSTRAP_ID_VERSION;
  id.flags = BOOTSTRAP_ID_EXTERNAL_ROOT;
  id.root = *addr;
  char a[SOCK_ADDR_STRLEN];
  sock_addr_str(addr, a, sizeof(a));
  const char* hex = param_str(P_COLLIE_BOOTSTRAP_SECRET);
  if (hex) {
    if (parse_hex_secret(hex, id.secret) != 0)
      return err_set(ncclInvalidArgument, "COLLIE_BOOTSTRAP_SECRET must be %d hex digits", 2 * FRAME_SECRET_BYTES);
  } else {
    /* Every process of a job can compute this, and a stranger who guesses it
     * still only gets past the frame check, not into the ring unnoticed. */
    static const char* job_vars[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID",
                                     "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", "PBS_JOBID", "LSB_JOBID"};
    uint64_t h1 = fnv1a(0xcbf29ce484222325ULL, a), h2 = fnv1a(0x84222325cbf29ce4ULL, a);
    for (size_t i = 0; i < sizeof(job_vars) / sizeof(job_vars[0]); i++) {
      h1 = fnv1a(fnv1a(h1, job_vars[i]), getenv(job_vars[i]));
      h2 = fnv1a(fnv1a(h2, getenv(job_vars[i])), job_vars[i]);
    }
    memcpy(id.secret, &h1, 8);
    memcpy(id.secret + 8, &h2, 8);
    INFO(LOG_BOOTSTRAP, "COLLIE_BOOTSTRAP_SECRET unset: bootstrap secret derived from %s and the job id", a);
  }
  uint64_t n = 0x9e3779b97f4a7c15ULL;
  for (int i = 0; i < FRAME_SECRET_BYTES; i++) n = (n ^ id.secret[i]) * 0x100000001b3ULL;
  id.nonce = fnv1a(n, a);
  memset(uid, 0, sizeof(*uid));
  memcpy(uid, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t bootstrap_create_id(ncclUniqueId* uid) {
  const char* env = param_str(P_NCCL_COMM_ID);
  if (env) {
    union sock_addr addr;
    NCCLCHECK(sock_parse_addr(env, "NCCL_COMM_ID", &addr));
    return bootstrap_id_from_addr(&addr, uid);
  }
  return bootstrap_create_fresh_id(uid);
}

ncclResult_t bootstrap_create_fresh_id(ncclUniqueId* uid) {
  struct bootstrap_id id;
  memset(&id, 0, sizeof(id));
  id.magic = BOOTSTRAP_ID_MAGIC;
  id.version = BOOTSTRAP_ID_VERSION;
  NCCLCHECK(random_bytes(id.secret, sizeof(id.secret)));
  NCCLCHECK(random_bytes(&id.nonce, sizeof(id.nonce)));
  char ifname[64];
  NCCLCHECK(sock_pick_interface(NULL, &id.root, ifname, sizeof(ifname)));
  NCCLCHECK(root_start(&id, 0));
  root_reap();
  memset(uid, 0, sizeof(*uid));
  memcpy(uid, &id, sizeof(id));
  return ncclSuccess;
}

/* ---------------------------------------------------------------- progress */

static void enqueue(struct bootstrap* bs, int32_t rank, uint32_t tag, uint32_t len, uint8_t* data) {
  struct bs_msg* m = malloc(sizeof(*m));
  if (!m) {
    free(data);
    return;
  }
  *m = (struct bs_msg){NULL, rank, tag, len, data};
  if (bs->qtail) bs->qtail->next = m;
  else bs->qhead = m;
  bs->qtail = m;
}

static void in_remove(struct bootstrap* bs, int i) {
  conn_close(&bs->in[i]);
  bs->in[i] = bs->in[--bs->nin];
}

/* Reads everything available on inbound connection i. Returns 1 if removed. */
static int in_service(struct bootstrap* bs, int i, int64_t now) {
  struct conn_reader* c = &bs->in[i];
  char why[256];
  for (;;) {
    int authed = c->rank >= 0;
    int ev = conn_progress(c, bs->secret, authed ? FRAME_MAX_PAYLOAD : 0, bs->nranks, why, sizeof(why));
    if (ev == CONN_AGAIN) break;
    if (ev == CONN_MSG) {
      uint8_t* payload = conn_take(c);
      if (!authed) {
        if (c->hdr.type != FRAME_HELLO || c->hdr.tag != (uint32_t)bs->rank || c->hdr.rank < 0) {
          free(payload);
          bootstrap_note_dropped(&c->from, "listener", "first frame is not a hello addressed to this rank");
          in_remove(bs, i);
          return 1;
        }
        c->rank = c->hdr.rank;
        c->deadline_ms = -1;
        continue;
      }
      if (c->hdr.type != FRAME_MSG || c->hdr.rank != c->rank) {
        free(payload);
        WARN("bootstrap: rank %d sent a malformed message (type %u, rank %d); closing its connection", c->rank,
             c->hdr.type, c->hdr.rank);
        bs->in_closed[c->rank] = 1;
        in_remove(bs, i);
        return 1;
      }
      enqueue(bs, c->rank, c->hdr.tag, c->hdr.len, payload);
      continue;
    }
    if (authed) {
      if (ev == CONN_BAD) WARN("bootstrap: connection from rank %d failed: %s", c->rank, why);
      bs->in_closed[c->rank] = 1;
    } else {
      bootstrap_note_dropped(&c->from, "listener", ev == CONN_BAD ? why : "closed before its hello");
    }
    in_remove(bs, i);
    return 1;
  }
  if (c->rank < 0 && now >= c->deadline_ms) {
    bootstrap_note_dropped(&c->from, "listener", "no hello before the handshake deadline");
    in_remove(bs, i);
    return 1;
  }
  return 0;
}

/* One round of waiting: accepts, reads, and (with want_fd >= 0) waits for
 * that fd to become writable. Sleeps at most `wait_ms` (capped at a slice). */
static ncclResult_t progress(struct bootstrap* bs, int64_t wait_ms, int want_fd, const struct wopt* o) {
  /* The wake fd stays readable once written: only a watched wait, which
   * then stops, may sleep on it (others would spin). */
  int wfd = o->watched && bs->stop ? bs->wake_fd : -1;
  int n = 1 + bs->nin + (want_fd >= 0) + (wfd >= 0);
  if (n > bs->cap_pfds) {
    int cap = n * 2;
    struct pollfd* np = realloc(bs->pfds, sizeof(*np) * (size_t)cap);
    if (!np) return err_set(ncclSystemError, "out of memory in bootstrap");
    bs->pfds = np;
    bs->cap_pfds = cap;
  }
  int64_t now = time_ms();
  if (wait_ms > POLL_SLICE_MS) wait_ms = POLL_SLICE_MS;
  bs->pfds[0] = (struct pollfd){.fd = bs->listen_fd, .events = POLLIN};
  int nin = bs->nin;
  for (int i = 0; i < nin; i++) {
    bs->pfds[1 + i] = (struct pollfd){.fd = bs->in[i].fd, .events = POLLIN};
    if (bs->in[i].rank < 0) wait_ms = COLLIE_MIN(wait_ms, bs->in[i].deadline_ms - now);
  }
  if (want_fd >= 0) bs->pfds[1 + nin] = (struct pollfd){.fd = want_fd, .events = POLLOUT};
  if (wfd >= 0) bs->pfds[n - 1] = (struct pollfd){.fd = wfd, .events = POLLIN};
  if (wait_ms < 0) wait_ms = 0;
  int rc = poll(bs->pfds, (nfds_t)n, (int)wait_ms);
  if (rc < 0) {
    if (errno == EINTR) return ncclSuccess;
    return err_set(ncclSystemError, "bootstrap poll failed: %s", strerror(errno));
  }
  now = time_ms();
  /* Walk backwards: in_service may swap the last entry into slot i. */
  for (int i = nin - 1; i >= 0; i--) {
    if (rc > 0 && (bs->pfds[1 + i].revents & (POLLIN | POLLHUP | POLLERR))) in_service(bs, i, now);
    else if (bs->in[i].rank < 0 && now >= bs->in[i].deadline_ms) in_service(bs, i, now);
  }
  if (rc > 0 && (bs->pfds[0].revents & POLLIN)) {
    for (;;) {
      int fd;
      union sock_addr from;
      if (sock_accept(bs->listen_fd, &fd, &from) != SOCK_OK) break;
      if (bs->nin == bs->cap_in) {
        int cap = bs->cap_in ? bs->cap_in * 2 : 16;
        struct conn_reader* np = realloc(bs->in, sizeof(*np) * (size_t)cap);
        if (!np) {
          close(fd);
          break;
        }
        bs->in = np;
        bs->cap_in = cap;
      }
      conn_reader_init(&bs->in[bs->nin], fd, &from, now + bs->handshake_ms);
      /* Data often arrives with the connection: read it now. */
      in_service(bs, bs->nin++, now);
    }
  }
  return ncclSuccess;
}

static int aborted(struct bootstrap* bs) {
  return bs->abort_flag && __atomic_load_n(bs->abort_flag, __ATOMIC_RELAXED);
}

/* The communicator's own reason to stop a watched wait (abort, revoke, a
 * recorded failure), err_set done; ncclSuccess to go on waiting. */
static ncclResult_t watch_check(struct bootstrap* bs, const struct wopt* o) {
  if (!o->watched || !bs->stop) return ncclSuccess;
  return bs->stop(bs->stop_arg);
}

/* Sends n bytes on a nonblocking fd while servicing inbound traffic. */
static ncclResult_t send_bytes(struct bootstrap* bs, int peer, int fd, const void* buf, size_t n, int64_t deadline,
                               struct wopt* o) {
  const char* p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t rc = send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      done += (size_t)rc;
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return err_set(ncclRemoteError, "bootstrap: rank %d cannot send to rank %d (%s): %s", bs->rank, peer,
                     bootstrap_peer_host(bs, peer), strerror(errno));
    if (aborted(bs)) return err_set(ncclSystemError, "bootstrap: send to rank %d aborted", peer);
    if (__atomic_load_n(&bs->failed[peer], __ATOMIC_RELAXED))
      return err_set(ncclRemoteError, "bootstrap: rank %d (%s) failed while rank %d was sending to it", peer,
                     bootstrap_peer_host(bs, peer), bs->rank);
    NCCLCHECK(watch_check(bs, o));
    int64_t now = time_ms();
    if (now >= deadline) {
      o->timed_out = 1;
      return err_set(ncclRemoteError, "bootstrap: rank %d timed out after %.1f s sending to rank %d (%s)", bs->rank,
                     o->timeout_ms / 1000.0, peer, bootstrap_peer_host(bs, peer));
    }
    NCCLCHECK(progress(bs, deadline - now, fd, o));
  }
  return ncclSuccess;
}

static ncclResult_t send_frame(struct bootstrap* bs, int peer, int fd, int type, uint32_t tag, const void* data,
                               size_t size, int64_t deadline, struct wopt* o) {
  struct frame_hdr h;
  uint8_t hdr[FRAME_HDR_BYTES];
  frame_init(&h, type, (uint32_t)size, bs->rank, tag, bs->secret);
  frame_encode(&h, hdr);
  NCCLCHECK(send_bytes(bs, peer, fd, hdr, sizeof(hdr), deadline, o));
  if (size) NCCLCHECK(send_bytes(bs, peer, fd, data, size, deadline, o));
  return ncclSuccess;
}

/* What ends a connect's retries early (sock_connect_opts.stop). */
struct connect_stop {
  struct bootstrap* bs;
  int peer;
  const struct wopt* o;
};

static ncclResult_t connect_stop_check(void* arg) {
  const struct connect_stop* x = arg;
  if (__atomic_load_n(&x->bs->failed[x->peer], __ATOMIC_RELAXED))
    return err_set(ncclRemoteError, "bootstrap: rank %d (%s) failed while rank %d was connecting to it", x->peer,
                   bootstrap_peer_host(x->bs, x->peer), x->bs->rank);
  return watch_check(x->bs, x->o);
}

static ncclResult_t connect_peer(struct bootstrap* bs, int peer, int64_t deadline, struct wopt* o) {
  if (bs->out_fd[peer] >= 0) return ncclSuccess;
  int fd;
  /* A refused connection is retried until the deadline (the peer may still be
   * starting); a peer known to have failed, or the communicator's own stop (a
   * watched call), ends the retries like the other bootstrap waits instead of
   * the whole timeout (a survivor setting up connectors to a rank that was
   * just killed hung there). */
  struct connect_stop x = {bs, peer, o};
  struct sock_connect_opts opt = {NULL, connect_stop_check, &x};
  int st = sock_connect_opt(&bs->peers[peer].addr, deadline, bs->abort_flag, &opt, &fd);
  if (st == SOCK_ABORTED) NCCLCHECK(connect_stop_check(&x));
  if (st != SOCK_OK) {
    char a[SOCK_ADDR_STRLEN];
    return err_set(st == SOCK_ABORTED ? ncclSystemError : ncclRemoteError,
                   "bootstrap: rank %d cannot connect to rank %d at %s (%s): %s", bs->rank, peer,
                   sock_addr_str(&bs->peers[peer].addr, a, sizeof(a)), bootstrap_peer_host(bs, peer),
                   st == SOCK_ERROR ? strerror(errno) : sock_status_str(st));
  }
  bs->out_fd[peer] = fd;
  ncclResult_t res = send_frame(bs, peer, fd, FRAME_HELLO, (uint32_t)peer, NULL, 0, deadline, o);
  if (res != ncclSuccess) {
    close(fd);
    bs->out_fd[peer] = -1;
  }
  return res;
}

static ncclResult_t send_locked(struct bootstrap* bs, int peer, uint32_t tag, const void* data, size_t size,
                               struct wopt* o) {
  if (size > FRAME_MAX_PAYLOAD)
    return err_set(ncclInvalidArgument, "bootstrap: message of %zu bytes exceeds the %u-byte limit", size,
                   FRAME_MAX_PAYLOAD);
  if (peer == bs->rank) {
    uint8_t* copy = size ? malloc(size) : NULL;
    if (size && !copy) return err_set(ncclSystemError, "out of memory in bootstrap");
    if (size) memcpy(copy, data, size);
    enqueue(bs, peer, tag, (uint32_t)size, copy);
    return ncclSuccess;
  }
  int64_t deadline = time_ms() + o->timeout_ms;
  NCCLCHECK(connect_peer(bs, peer, deadline, o));
  ncclResult_t res = send_frame(bs, peer, bs->out_fd[peer], FRAME_MSG, tag, data, size, deadline, o);
  if (res != ncclSuccess) {
    /* The stream may hold half a frame: never reuse it. */
    close(bs->out_fd[peer]);
    bs->out_fd[peer] = -1;
  }
  return res;
}

/* Waits for the next message from `peer` with `tag`, whatever its size:
 * hands over the message (free it and its data). */
static ncclResult_t recv_take(struct bootstrap* bs, int peer, uint32_t tag, struct bs_msg** out, struct wopt* o) {
  int64_t deadline = time_ms() + o->timeout_ms;
  for (;;) {
    struct bs_msg** pp = &bs->qhead;
    struct bs_msg* prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
      struct bs_msg* m = *pp;
      if (m->rank != peer || m->tag != tag) continue;
      *pp = m->next;
      if (bs->qtail == m) bs->qtail = prev;
      *out = m;
      return ncclSuccess;
    }
    if (__atomic_load_n(&bs->failed[peer], __ATOMIC_RELAXED))
      return err_set(ncclRemoteError, "bootstrap: rank %d (%s) failed while rank %d waited for it (tag 0x%x)", peer,
                     bootstrap_peer_host(bs, peer), bs->rank, tag);
    if (bs->in_closed[peer])
      return err_set(ncclRemoteError,
                     "bootstrap: rank %d (%s) closed its connection to rank %d while a message (tag 0x%x) "
                     "was awaited: did that process exit or fail?",
                     peer, bootstrap_peer_host(bs, peer), bs->rank, tag);
    if (aborted(bs)) return err_set(ncclSystemError, "bootstrap: receive from rank %d aborted", peer);
    NCCLCHECK(watch_check(bs, o));
    int64_t now = time_ms();
    if (now >= deadline) {
      o->timed_out = 1;
      return err_set(ncclRemoteError, "bootstrap: rank %d timed out after %.1f s waiting for rank %d (%s), tag 0x%x%s",
                     bs->rank, o->timeout_ms / 1000.0, peer, bootstrap_peer_host(bs, peer), tag,
                     o->timeout_ms == bs->timeout_ms ? " (COLLIE_BOOTSTRAP_TIMEOUT)" : "");
    }
    NCCLCHECK(progress(bs, deadline - now, -1, o));
  }
}

static ncclResult_t recv_locked(struct bootstrap* bs, int peer, uint32_t tag, void* data, size_t size,
                               struct wopt* o) {
  struct bs_msg* m = NULL;
  NCCLCHECK(recv_take(bs, peer, tag, &m, o));
  ncclResult_t res = ncclSuccess;
  if (m->len != size)
    res = err_set(ncclInternalError,
                  "bootstrap: rank %d expected %zu bytes from rank %d (tag 0x%x) but received %u "
                  "(ranks disagree on the message size)",
                  bs->rank, size, peer, tag, m->len);
  else if (size)
    memcpy(data, m->data, size);
  free(m->data);
  free(m);
  return res;
}

static ncclResult_t check_peer(struct bootstrap* bs, int peer, const char* what) {
  if (peer < 0 || peer >= bs->nranks)
    return err_set(ncclInvalidArgument, "bootstrap %s: peer %d outside [0, %d)", what, peer, bs->nranks);
  return ncclSuccess;
}

ncclResult_t bootstrap_send(struct bootstrap* bs, int peer, uint32_t tag, const void* data, size_t size) {
  NCCLCHECK(check_peer(bs, peer, "send"));
  struct wopt o = WOPT_DEFAULT(bs);
  pthread_mutex_lock(&bs->lock);
  ncclResult_t res = send_locked(bs, peer, tag, data, size, &o);
  pthread_mutex_unlock(&bs->lock);
  return res;
}

ncclResult_t bootstrap_recv(struct bootstrap* bs, int peer, uint32_t tag, void* data, size_t size) {
  NCCLCHECK(check_peer(bs, peer, "recv"));
  struct wopt o = WOPT_DEFAULT(bs);
  pthread_mutex_lock(&bs->lock);
  ncclResult_t res = recv_locked(bs, peer, tag, data, size, &o);
  pthread_mutex_unlock(&bs->lock);
  return res;
}

ncclResult_t bootstrap_send_ctl(struct bootstrap* bs, int peer, uint32_t tag, const void* data, size_t size,
                                int64_t timeout_ms, int* timed_out) {
  NCCLCHECK(check_peer(bs, peer, "send"));
  struct wopt o = {0, timeout_ms > 0 ? timeout_ms : bs->timeout_ms, 0};
  pthread_mutex_lock(&bs->lock);
  ncclResult_t res = send_locked(bs, peer, tag, data, size, &o);
  pthread_mutex_unlock(&bs->lock);
  if (timed_out) *timed_out = o.timed_out;
  return res;
}

ncclResult_t bootstrap_recv_ctl(struct bootstrap* bs, int peer, uint32_t tag, void* data, size_t size,
                                int64_t timeout_ms, int* timed_out) {
  NCCLCHECK(check_peer(bs, peer, "recv"));
  struct wopt o = {0, timeout_ms > 0 ? timeout_ms : bs->timeout_ms, 0};
  pthread_mutex_lock(&bs->lock);
  ncclResult_t res = recv_locked(bs, peer, tag, data, size, &o);
  pthread_mutex_unlock(&bs->lock);
  if (timed_out) *timed_out = o.timed_out;
  return res;
}

/* Bruck allgather: ceil(log2 n) rounds; in the round of distance d a rank
 * sends the min(d, n-d) blocks it holds (its own and those of the d-1 ranks
 * after it) to rank - d and receives as many from rank + d. A ring would take
 * n-1 rounds, each needing every process scheduled once: with many more
 * processes than cores that is what made init quadratic. `tmp` holds the
 * blocks rotated so that ours is first. */
static ncclResult_t allgather_locked(struct bootstrap* bs, void* all, size_t size) {
  int n = bs->nranks, r = bs->rank;
  if (n == 1 || size == 0) return ncclSuccess;
  char* base = all;
  char* tmp = malloc(size * (size_t)n);
  if (!tmp) return err_set(ncclSystemError, "out of memory in bootstrap allgather (%d x %zu bytes)", n, size);
  memcpy(tmp, base + (size_t)r * size, size);
  struct wopt o = WOPT_DEFAULT(bs);
  ncclResult_t res = ncclSuccess;
  for (int k = 0, d = 1; d < n && res == ncclSuccess; k++, d <<= 1) {
    size_t cnt = (size_t)COLLIE_MIN(d, n - d);
    uint32_t tag = TAG_ALLGATHER | (uint32_t)k;
    res = send_locked(bs, (r - d + n) % n, tag, tmp, cnt * size, &o);
    if (res == ncclSuccess) res = recv_locked(bs, (r + d) % n, tag, tmp + (size_t)d * size, cnt * size, &o);
  }
  if (res == ncclSuccess)
    for (int i = 0; i < n; i++) memcpy(base + (size_t)((r + i) % n) * size, tmp + (size_t)i * size, size);
  free(tmp);
  return res;
}

ncclResult_t bootstrap_allgather(struct bootstrap* bs, void* all, size_t size) {
  pthread_mutex_lock(&bs->lock);
  ncclResult_t res = allgather_locked(bs, all, size);
  pthread_mutex_unlock(&bs->lock);
  return res;
}

ncclResult_t bootstrap_barrier(struct bootstrap* bs) {
  /* Dissemination barrier: ceil(log2 n) rounds of one empty message. */
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&bs->lock);
  int n = bs->nranks, r = bs->rank;
  struct wopt o = WOPT_DEFAULT(bs);
  for (int k = 0, d = 1; d < n && res == ncclSuccess; k++, d <<= 1) {
    res = send_locked(bs, (r + d) % n, TAG_BARRIER | (uint32_t)k, NULL, 0, &o);
    if (res == ncclSuccess) res = recv_locked(bs, (r - d % n + n) % n, TAG_BARRIER | (uint32_t)k, NULL, 0, &o);
  }
  pthread_mutex_unlock(&bs->lock);
  return res;
}

ncclResult_t bootstrap_bcast(struct bootstrap* bs, int root, void* data, size_t size) {
  NCCLCHECK(check_peer(bs, root, "bcast"));
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&bs->lock);
  int n = bs->nranks;
  int vr = (bs->rank - root + n) % n;
  /* Binomial tree: receive from the parent (vr without its lowest set bit),
   * then send to children vr + 2^k for every 2^k below that bit. */
  int mask = 1;
  struct wopt o = WOPT_DEFAULT(bs);
  while (mask < n && !(vr & mask)) mask <<= 1;
  if (vr != 0) res = recv_locked(bs, ((vr & ~mask) + root) % n, TAG_BCAST, data, size, &o);
  for (mask >>= 1; res == ncclSuccess && mask > 0; mask >>= 1)
    if (vr + mask < n) res = send_locked(bs, (vr + mask + root) % n, TAG_BCAST, data, size, &o);
  pthread_mutex_unlock(&bs->lock);
  return res;
}

/* ---------------------------------------------------------------- init */

static int block_first(int k, int nranks, int nroots) { return (int)((int64_t)k * nranks / nroots); }

void bootstrap_destroy(struct bootstrap* bs) {
  if (!bs) return;
  for (int i = 0; i < bs->nranks; i++)
    if (bs->out_fd && bs->out_fd[i] >= 0) close(bs->out_fd[i]);
  for (int i = 0; i < bs->nin; i++) conn_close(&bs->in[i]);
  if (bs->listen_fd >= 0) close(bs->listen_fd);
  while (bs->qhead) {
    struct bs_msg* m = bs->qhead;
    bs->qhead = m->next;
    free(m->data);
    free(m);
  }
  pthread_mutex_destroy(&bs->lock);
  free(bs->in);
  free(bs->pfds);
  free(bs->peers);
  free(bs->out_fd);
  free(bs->in_closed);
  free(bs->failed);
  free(bs->card_len);
  free(bs->card_off);
  free(bs->cards);
  free(bs);
}

/* Sends one check-in frame to a root; returns the open fd. */
static ncclResult_t checkin_send(struct bootstrap* bs, const struct bootstrap_id* id, int nroots, int root_index,
                                 int neighbor, const uint8_t* card, uint32_t card_len, int64_t deadline, int* out_fd) {
  char a[SOCK_ADDR_STRLEN];
  int fd;
  int st = sock_connect(&id->root, deadline, bs->abort_flag, &fd);
  if (st != SOCK_OK)
    return err_set(st == SOCK_ABORTED ? ncclSystemError : ncclRemoteError,
                   "bootstrap: rank %d cannot reach the root at %s: %s (is the process that called "
                   "ncclGetUniqueId still running?)",
                   bs->rank, sock_addr_str(&id->root, a, sizeof(a)),
                   st == SOCK_ERROR ? strerror(errno) : sock_status_str(st));
  struct checkin ci = {.rank = bs->rank, .nranks = bs->nranks, .nroots = nroots, .root_index = root_index,
                       .neighbor = neighbor, .nonce = id->nonce};
  memcpy(ci.addr, &bs->listen_addr, sizeof(ci.addr));
  uint8_t payload[CHECKIN_BYTES + CHECKIN_CARD_MAX], hdr[FRAME_HDR_BYTES];
  checkin_encode(&ci, payload);
  if (card_len) memcpy(payload + CHECKIN_BYTES, card, card_len);
  struct frame_hdr h;
  frame_init(&h, FRAME_CHECKIN, CHECKIN_BYTES + card_len, bs->rank, 0, id->secret);
  frame_encode(&h, hdr);
  st = sock_send_all(fd, hdr, sizeof(hdr), deadline, bs->abort_flag);
  if (st == SOCK_OK) st = sock_send_all(fd, payload, CHECKIN_BYTES + card_len, deadline, bs->abort_flag);
  if (st != SOCK_OK) {
    close(fd);
    return err_set(ncclRemoteError, "bootstrap: rank %d failed to check in with the root at %s: %s", bs->rank,
                   sock_addr_str(&id->root, a, sizeof(a)), sock_status_str(st));
  }
  *out_fd = fd;
  return ncclSuccess;
}

/* Waits for the root's answer: for the block's first rank, the next block's
 * first rank's address and the block's table (at most max_len bytes); for
 * the others, the ring successor's address (exactly max_len bytes). Or an
 * error. *out (free it) holds the reply. */
static ncclResult_t checkin_wait(struct bootstrap* bs, const struct bootstrap_id* id, int fd, int64_t deadline,
                                 uint32_t max_len, int exact, uint8_t** out, uint32_t* out_len) {
  char a[SOCK_ADDR_STRLEN];
  uint8_t hdr[FRAME_HDR_BYTES];
  struct frame_hdr h;
  int st = sock_recv_all(fd, hdr, sizeof(hdr), deadline, bs->abort_flag);
  if (st == SOCK_TIMEOUT)
    return err_set(ncclRemoteError,
                   "bootstrap: rank %d got no answer from the root at %s within %lld s: not all %d ranks "
                   "checked in and the root did not say which (is it still running?)",
                   bs->rank, sock_addr_str(&id->root, a, sizeof(a)), (long long)(bs->timeout_ms / 1000),
                   bs->nranks);
  if (st != SOCK_OK)
    return err_set(st == SOCK_ABORTED ? ncclSystemError : ncclRemoteError,
                   "bootstrap: rank %d lost the root at %s while waiting for the other ranks: %s", bs->rank,
                   sock_addr_str(&id->root, a, sizeof(a)), sock_status_str(st));
  int v = frame_decode(hdr, sizeof(hdr), id->secret, COLLIE_MAX(4096u, max_len), 1, &h);
  if (v != FRAME_OK)
    return err_set(ncclRemoteError, "bootstrap: rank %d received a bad reply from the root: %s", bs->rank,
                   frame_verdict_str(v));
  if (h.type == FRAME_ROOT_ERROR) {
    char buf[4097];
    if (h.len > 4096 || (h.len && sock_recv_all(fd, buf, h.len, deadline, bs->abort_flag) != SOCK_OK))
      return err_set(ncclRemoteError, "bootstrap: rank %d: truncated error from the root", bs->rank);
    buf[h.len] = '\0';
    ncclResult_t code = h.tag == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError;
    return err_set(code, "%s (seen by rank %d)", buf, bs->rank);
  }
  if (h.type != FRAME_ROOT_REPLY || h.len > max_len || (exact && h.len != max_len))
    return err_set(ncclRemoteError, "bootstrap: rank %d: unexpected reply (type %u, %u bytes, expected %s%u) from the root",
                   bs->rank, h.type, h.len, exact ? "" : "at most ", max_len);
  uint8_t* buf = malloc(h.len ? h.len : 1);
  if (!buf) return err_set(ncclSystemError, "out of memory in bootstrap (%u-byte reply)", h.len);
  st = sock_recv_all(fd, buf, h.len, deadline, bs->abort_flag);
  if (st != SOCK_OK) {
    free(buf);
    return err_set(st == SOCK_ABORTED ? ncclSystemError : ncclRemoteError,
                   "bootstrap: rank %d: truncated reply from the root at %s (%u-byte payload): %s", bs->rank,
                   sock_addr_str(&id->root, a, sizeof(a)), h.len, st == SOCK_ERROR ? strerror(errno) : sock_status_str(st));
  }
  *out = buf;
  *out_len = h.len;
  return ncclSuccess;
}

/* ---- the table: every rank's address and card
 * On the wire, ranks [first, first+count): their addresses, then their card
 * lengths (4 bytes each), then the cards one after another. */

static size_t table_bytes(const struct bootstrap* bs, int first, int count) {
  size_t len = (sizeof(union sock_addr) + 4) * (size_t)count;
  for (int i = first; i < first + count; i++) len += bs->card_len[i];
  return len;
}

static void table_write(const struct bootstrap* bs, int first, int count, uint8_t* p) {
  size_t a = sizeof(union sock_addr);
  for (int i = first; i < first + count; i++, p += a) memcpy(p, &bs->peers[i].addr, a);
  for (int i = first; i < first + count; i++, p += 4) memcpy(p, &bs->card_len[i], 4);
  for (int i = first; i < first + count; i++) {
    if (bs->card_len[i]) memcpy(p, bs->cards + bs->card_off[i], bs->card_len[i]);
    p += bs->card_len[i];
  }
}

/* Stores what table_write wrote for [first, first+count), checking that it
 * is exactly that (sizes add up, addresses valid, cards not too long). */
static ncclResult_t table_read(struct bootstrap* bs, int first, int count, const uint8_t* p, size_t len, int from) {
  size_t a = sizeof(union sock_addr), fixed = (a + 4) * (size_t)count, cards = 0;
  const char* bad = NULL;
  if (len < fixed) bad = "too short";
  for (int i = 0; !bad && i < count; i++) {
    uint32_t l;
    memcpy(&l, p + a * (size_t)count + 4 * (size_t)i, 4);
    if (l > CHECKIN_CARD_MAX) bad = "a card too long";
    cards += l;
  }
  if (!bad && fixed + cards != len) bad = "sizes that do not add up";
  for (int i = 0; !bad && i < count; i++) {
    union sock_addr x;
    memcpy(&x, p + a * (size_t)i, a);
    if (!sock_addr_valid(&x)) bad = "an invalid address";
  }
  if (bad && from < 0)
    return err_set(ncclRemoteError, "bootstrap: rank %d got a malformed address table (%s) from the root", bs->rank,
                   bad);
  if (bad)
    return err_set(ncclRemoteError, "bootstrap: rank %d got a malformed address table (%s) from rank %d", bs->rank,
                   bad, from);
  if (bs->ncards + cards > bs->cap_cards) {
    size_t cap = COLLIE_MAX(2 * bs->cap_cards, bs->ncards + cards);
    uint8_t* nc = realloc(bs->cards, cap ? cap : 1);
    if (!nc) return err_set(ncclSystemError, "out of memory in bootstrap (%zu bytes of cards)", cap);
    bs->cards = nc;
    bs->cap_cards = cap;
  }
  const uint8_t* c = p + fixed;
  for (int i = 0; i < count; i++) {
    int q = first + i;
    memcpy(&bs->peers[q].addr, p + a * (size_t)i, a);
    memcpy(&bs->card_len[q], p + a * (size_t)count + 4 * (size_t)i, 4);
    bs->card_off[q] = bs->ncards;
    if (bs->card_len[q]) memcpy(bs->cards + bs->ncards, c, bs->card_len[q]);
    c += bs->card_len[q];
    bs->ncards += bs->card_len[q];
  }
  return ncclSuccess;
}

/* Sends the table of [first, first+count) to `peer`. */
static ncclResult_t table_send(struct bootstrap* bs, int peer, uint32_t tag, int first, int count, struct wopt* o) {
  size_t len = table_bytes(bs, first, count);
  uint8_t* buf = malloc(len ? len : 1);
  if (!buf) return err_set(ncclSystemError, "out of memory in bootstrap (%zu-byte table)", len);
  table_write(bs, first, count, buf);
  ncclResult_t res = send_locked(bs, peer, tag, buf, len, o);
  free(buf);
  return res;
}

static ncclResult_t table_recv(struct bootstrap* bs, int peer, uint32_t tag, int first, int count, struct wopt* o) {
  struct bs_msg* m = NULL;
  NCCLCHECK(recv_take(bs, peer, tag, &m, o));
  ncclResult_t res = table_read(bs, first, count, m->data, m->len, peer);
  free(m->data);
  free(m);
  return res;
}

/* Every rank learns every rank's listening address and card. Each root gave
 * its block's table to the block's first rank (the leader); with several
 * roots the leaders pass the block tables around their ring (nroots-1
 * steps); then each leader sends the whole table down a binomial tree over
 * its block. A rank wakes up about once (to receive) plus once per child,
 * instead of once per round of an allgather over every rank; the root sends
 * one table, not one per rank. `reply` is the leader's answer from the root. */
static ncclResult_t spread_table(struct bootstrap* bs, int k, int nids, const uint8_t* reply, uint32_t reply_len) {
  int n = bs->nranks, r = bs->rank;
  int first = block_first(k, n, nids), count = block_first(k + 1, n, nids) - first;
  size_t a = sizeof(union sock_addr);
  struct wopt o = WOPT_DEFAULT(bs);
  int vr = r - first;
  if (vr == 0) {
    union sock_addr next_leader_addr;
    memcpy(&next_leader_addr, reply, a);
    NCCLCHECK(table_read(bs, first, count, reply + a, reply_len - a, -1));
    if (nids > 1) {
      int next_leader = block_first((k + 1) % nids, n, nids), prev_leader = block_first((k + nids - 1) % nids, n, nids);
      if (!sock_addr_valid(&next_leader_addr))
        return err_set(ncclRemoteError, "bootstrap: rank %d: the root sent an invalid address for rank %d", r,
                       next_leader);
      bs->peers[next_leader].addr = next_leader_addr;
      for (int s = 0; s < nids - 1; s++) {
        int sb = (k - s + nids) % nids, rb = (k - s - 1 + nids) % nids;
        int sf = block_first(sb, n, nids), sc = block_first(sb + 1, n, nids) - sf;
        int rf = block_first(rb, n, nids), rc = block_first(rb + 1, n, nids) - rf;
        NCCLCHECK(table_send(bs, next_leader, TAG_TABLE | (uint32_t)s, sf, sc, &o));
        NCCLCHECK(table_recv(bs, prev_leader, TAG_TABLE | (uint32_t)s, rf, rc, &o));
      }
    }
  } else {
    /* The table comes from the parent: vr less its lowest set bit. */
    NCCLCHECK(table_recv(bs, first + (vr & (vr - 1)), TAG_TABLE | 0xffffffu, 0, n, &o));
  }
  /* Children: vr + 2^j for every 2^j below vr's lowest set bit (all of them for the leader). */
  int low = vr ? (vr & -vr) : 1;
  while (!vr && low < count) low <<= 1;
  if (low > 1 && vr + 1 < count) {
    size_t len = table_bytes(bs, 0, n);
    uint8_t* buf = malloc(len);
    if (!buf) return err_set(ncclSystemError, "out of memory in bootstrap (%zu-byte table)", len);
    table_write(bs, 0, n, buf);
    ncclResult_t res = ncclSuccess;
    for (int m = low >> 1; m > 0 && res == ncclSuccess; m >>= 1)
      if (vr + m < count) res = send_locked(bs, first + vr + m, TAG_TABLE | 0xffffffu, buf, len, &o);
    free(buf);
    NCCLCHECK(res);
  }
  return ncclSuccess;
}

ncclResult_t bootstrap_init(const ncclUniqueId* ids, int nids, int rank, int nranks, volatile uint32_t* abort_flag,
                            bootstrap_card_fn make_card, void* card_arg, struct bootstrap** out) {
  if (nids < 1 || nids > nranks)
    return err_set(ncclInvalidArgument, "bootstrap: %d unique IDs for %d ranks (need 1..nranks)", nids, nranks);
  int k = 0;
  while (k + 1 < nids && block_first(k + 1, nranks, nids) <= rank) k++;
  struct bootstrap_id id, id0;
  NCCLCHECK(bootstrap_id_decode(&ids[k], &id));
  NCCLCHECK(bootstrap_id_decode(&ids[0], &id0));

  ncclResult_t res = ncclSuccess;
  int root_fd = -1;
  int64_t t0 = time_ns();
  struct bootstrap* bs = calloc(1, sizeof(*bs));
  if (!bs) return err_set(ncclSystemError, "out of memory in bootstrap");
  bs->rank = rank;
  bs->nranks = nranks;
  bs->listen_fd = -1;
  bs->wake_fd = -1;
  bs->abort_flag = abort_flag;
  memcpy(bs->secret, id0.secret, sizeof(bs->secret));
  bs->nonce = id0.nonce;
  bs->timeout_ms = param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  bs->handshake_ms = param_int(P_COLLIE_BOOTSTRAP_HANDSHAKE_TIMEOUT, 10, 3600000);
  bs->listen_any = (int)param_int(P_COLLIE_LISTEN_ANY, 0, 1);
  pthread_mutex_init(&bs->lock, NULL);
  bs->peers = calloc((size_t)nranks, sizeof(*bs->peers));
  bs->out_fd = malloc(sizeof(int) * (size_t)nranks);
  bs->in_closed = calloc((size_t)nranks, 1);
  bs->failed = calloc((size_t)nranks, 1);
  bs->card_len = calloc((size_t)nranks, sizeof(*bs->card_len));
  bs->card_off = calloc((size_t)nranks, sizeof(*bs->card_off));
  if (!bs->peers || !bs->out_fd || !bs->in_closed || !bs->failed || !bs->card_len || !bs->card_off) {
    res = err_set(ncclSystemError, "out of memory in bootstrap (%d ranks)", nranks);
    goto fail;
  }
  for (int i = 0; i < nranks; i++) bs->out_fd[i] = -1;

  /* NCCL_COMM_ID mode: the first rank of each block serves that block's root. */
  if ((id.flags & BOOTSTRAP_ID_EXTERNAL_ROOT) && rank == block_first(k, nranks, nids)) {
    struct bootstrap_id rid = id;
    NCCLCHECKGOTO(root_start(&rid, 1), res, fail);
  }
  char ifname[64];
  NCCLCHECKGOTO(sock_pick_interface(&id.root, &bs->listen_addr, ifname, sizeof(ifname)), res, fail);
  NCCLCHECKGOTO(sock_listen_on(&bs->listen_addr, bs->listen_any, &bs->listen_fd), res, fail);
  {
    char a[SOCK_ADDR_STRLEN];
    TRACE(LOG_BOOTSTRAP, "rank %d listening on %s (%s)", rank, sock_addr_str(&bs->listen_addr, a, sizeof(a)),
          ifname);
  }

  uint8_t card[CHECKIN_CARD_MAX];
  int card_len = make_card ? make_card(card_arg, &bs->listen_addr, bs->listen_any, card, sizeof(card)) : 0;
  if (card_len < 0) {
    res = ncclSystemError; /* make_card did err_set */
    goto fail;
  }
  if ((size_t)card_len > sizeof(card)) {
    res = err_set(ncclInternalError, "bootstrap: a card of %d bytes (at most %zu)", card_len, sizeof(card));
    goto fail;
  }
  int64_t deadline = time_ms() + bs->timeout_ms;
  NCCLCHECKGOTO(checkin_send(bs, &id, nids, k, 0, card, (uint32_t)card_len, deadline, &root_fd), res, fail);
  if (nids > 1 && rank == block_first(k, nranks, nids)) {
    int prev = (k + nids - 1) % nids, nfd;
    struct bootstrap_id pid;
    NCCLCHECKGOTO(bootstrap_id_decode(&ids[prev], &pid), res, fail);
    NCCLCHECKGOTO(checkin_send(bs, &pid, nids, prev, 1, NULL, 0, deadline, &nfd), res, fail);
    close(nfd); /* the root reads it from the socket buffer; no reply */
  }
  /* The root's own deadline runs from the first check-in; allow it time to
   * tell us who is missing before we give up on it. */
  {
    int leader = rank == block_first(k, nranks, nids);
    size_t a = sizeof(union sock_addr);
    uint64_t max_len = leader ? a + (uint64_t)(a + 4 + CHECKIN_CARD_MAX) * (uint64_t)(block_first(k + 1, nranks, nids) - rank)
                              : a;
    uint8_t* reply = NULL;
    uint32_t reply_len = 0;
    res = checkin_wait(bs, &id, root_fd, time_ms() + bs->timeout_ms + 3000,
                       (uint32_t)COLLIE_MIN(max_len, (uint64_t)FRAME_MAX_PAYLOAD), !leader, &reply, &reply_len);
    close(root_fd);
    root_fd = -1;
    root_reap();
    bs->phase_ms[0] = (time_ns() - t0) / 1e6;
    if (res == ncclSuccess && leader && reply_len < a)
      res = err_set(ncclRemoteError, "bootstrap: rank %d: short reply from the root", rank);
    if (res == ncclSuccess) res = spread_table(bs, k, nids, reply, reply_len);
    /* After our own part of the spreading, which need not wait for it. */
    if (res == ncclSuccess) root_wait_served(&id);
    free(reply);
    if (res != ncclSuccess) goto fail;
  }
  bs->peers[rank].addr = bs->listen_addr;
  gethostname(bs->peers[rank].host, sizeof(bs->peers[rank].host) - 1);
  bs->phase_ms[1] = (time_ns() - t0) / 1e6 - bs->phase_ms[0];
  *out = bs;
  return ncclSuccess;
fail:
  if (root_fd >= 0) close(root_fd);
  bootstrap_destroy(bs);
  root_reap();
  return res;
}
