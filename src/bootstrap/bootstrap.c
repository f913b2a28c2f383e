/* Rank side of the bootstrap: check-in with the root, the ring, tagged
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
#define TAG_ALLGATHERV (BOOTSTRAP_TAG_INTERNAL | 0x5000000u)
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

static ncclResult_t connect_peer(struct bootstrap* bs, int peer, int64_t deadline, struct wopt* o) {
  if (bs->out_fd[peer] >= 0) return ncclSuccess;
  int fd;
  int st = sock_connect(&bs->peers[peer].addr, deadline, bs->abort_flag, &fd);
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
  struct bs_msg* m;
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

/* Bruck as above with blocks of any size. What a rank holds is kept rotated
 * (its own block first), each block behind a 4-byte length; a round sends
 * the first cnt blocks as they are and appends what comes, after checking
 * that it is exactly cnt well-formed blocks. */
static ncclResult_t allgatherv_locked(struct bootstrap* bs, const void* mine, uint32_t len, uint8_t** out,
                                      size_t* offs) {
  int n = bs->nranks, r = bs->rank;
  struct wopt o = WOPT_DEFAULT(bs);
  ncclResult_t res = ncclSuccess;
  size_t cap = 4 + (size_t)len, used = 0;
  uint8_t *buf = malloc(cap), *all = NULL;
  size_t* roff = malloc(sizeof(size_t) * ((size_t)n + 1)); /* roff[i]: where rotated block i starts */
  if (!buf || !roff) {
    res = err_set(ncclSystemError, "out of memory in bootstrap allgatherv (%d ranks)", n);
    goto out;
  }
  memcpy(buf, &len, 4);
  memcpy(buf + 4, mine, len);
  used = 4 + (size_t)len;
  roff[0] = 0;
  roff[1] = used;
  for (int k = 0, d = 1; d < n; k++, d <<= 1) {
    int cnt = COLLIE_MIN(d, n - d);
    uint32_t tag = TAG_ALLGATHERV | (uint32_t)k;
    NCCLCHECKGOTO(send_locked(bs, (r - d + n) % n, tag, buf, roff[cnt], &o), res, out);
    struct bs_msg* m;
    NCCLCHECKGOTO(recv_take(bs, (r + d) % n, tag, &m, &o), res, out);
    size_t at = 0;
    int got = 0;
    while (got < cnt && at + 4 <= m->len) {
      uint32_t l;
      memcpy(&l, m->data + at, 4);
      if (l > m->len - at - 4) break;
      at += 4 + (size_t)l;
      roff[d + got + 1] = used + at;
      got++;
    }
    if (got != cnt || at != m->len) {
      res = err_set(ncclRemoteError, "bootstrap allgatherv: rank %d sent rank %d a malformed message (%u bytes, "
                    "%d of %d blocks readable)", (r + d) % n, r, m->len, got, cnt);
      free(m->data);
      free(m);
      goto out;
    }
    if (used + at > cap) {
      size_t ncap = COLLIE_MAX(2 * cap, used + at);
      uint8_t* nb = realloc(buf, ncap);
      if (!nb) {
        free(m->data);
        free(m);
        res = err_set(ncclSystemError, "out of memory in bootstrap allgatherv");
        goto out;
      }
      buf = nb;
      cap = ncap;
    }
    if (at) memcpy(buf + used, m->data, at);
    used += at;
    free(m->data);
    free(m);
  }
  /* Unrotate, dropping the length prefixes: block i came from rank (r + i) % n. */
  size_t total = used - 4 * (size_t)n;
  all = malloc(total ? total : 1);
  if (!all) {
    res = err_set(ncclSystemError, "out of memory in bootstrap allgatherv");
    goto out;
  }
  offs[0] = 0;
  for (int q = 0; q < n; q++) {
    int i = (q - r + n) % n;
    size_t l = roff[i + 1] - roff[i] - 4;
    memcpy(all + offs[q], buf + roff[i] + 4, l);
    offs[q + 1] = offs[q] + l;
  }
  *out = all;
  all = NULL;
out:
  free(all);
  free(buf);
  free(roff);
  return res;
}

ncclResult_t bootstrap_allgatherv(struct bootstrap* bs, const void* mine, uint32_t len, uint8_t** out, size_t* offs) {
  *out = NULL;
  pthread_mutex_lock(&bs->lock);
  ncclResult_t res = allgatherv_locked(bs, mine, len, out, offs);
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
  free(bs);
}

/* Sends one check-in frame to a root; returns the open fd. */
static ncclResult_t checkin_send(struct bootstrap* bs, const struct bootstrap_id* id, int nroots, int root_index,
                                 int neighbor, int64_t deadline, int* out_fd) {
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
  uint8_t payload[CHECKIN_BYTES], hdr[FRAME_HDR_BYTES];
  checkin_encode(&ci, payload);
  struct frame_hdr h;
  frame_init(&h, FRAME_CHECKIN, CHECKIN_BYTES, bs->rank, 0, id->secret);
  frame_encode(&h, hdr);
  st = sock_send_all(fd, hdr, sizeof(hdr), deadline, bs->abort_flag);
  if (st == SOCK_OK) st = sock_send_all(fd, payload, sizeof(payload), deadline, bs->abort_flag);
  if (st != SOCK_OK) {
    close(fd);
    return err_set(ncclRemoteError, "bootstrap: rank %d failed to check in with the root at %s: %s", bs->rank,
                   sock_addr_str(&id->root, a, sizeof(a)), sock_status_str(st));
  }
  *out_fd = fd;
  return ncclSuccess;
}

/* Waits for the root's answer: `want` addresses (the block's first rank: the
 * next block's first rank, then its block's table; the others: the ring
 * successor), or an error. */
static ncclResult_t checkin_wait(struct bootstrap* bs, const struct bootstrap_id* id, int fd, int64_t deadline,
                                 union sock_addr* reply, int want) {
  char a[SOCK_ADDR_STRLEN];
  uint8_t hdr[FRAME_HDR_BYTES];
  struct frame_hdr h;
  uint32_t want_len = (uint32_t)(sizeof(*reply) * (size_t)want);
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
  int v = frame_decode(hdr, sizeof(hdr), id->secret, COLLIE_MAX(4096u, want_len), 1, &h);
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
  if (h.type != FRAME_ROOT_REPLY || h.len != want_len)
    return err_set(ncclRemoteError, "bootstrap: rank %d: unexpected reply (type %u, %u bytes, expected %u) from the root",
                   bs->rank, h.type, h.len, want_len);
  if (sock_recv_all(fd, reply, want_len, deadline, bs->abort_flag) != SOCK_OK)
    return err_set(ncclRemoteError, "bootstrap: rank %d: truncated reply from the root", bs->rank);
  for (int i = 0; i < want; i++)
    if (!sock_addr_valid(&reply[i]))
      return err_set(ncclRemoteError, "bootstrap: rank %d: the root sent an invalid address (entry %d)", bs->rank, i);
  return ncclSuccess;
}

/* Every rank learns every rank's listening address. Each root gave its
 * block's table to the block's first rank (the leader); with several roots
 * the leaders pass the block tables around their ring (nroots-1 steps);
 * then each leader sends the whole table down a binomial tree over its block.
 * log2(block) sequential hops instead of the n-1 of a ring allgather; the
 * root sends one table, not one per rank. `reply` is what checkin_wait
 * returned to this rank. */
static ncclResult_t spread_table(struct bootstrap* bs, int k, int nids, const union sock_addr* reply) {
  int n = bs->nranks, r = bs->rank;
  int first = block_first(k, n, nids), count = block_first(k + 1, n, nids) - first;
  size_t a = sizeof(union sock_addr);
  union sock_addr* tab = calloc((size_t)n, a);
  if (!tab) return err_set(ncclSystemError, "out of memory in bootstrap (%d addresses)", n);
  struct wopt o = WOPT_DEFAULT(bs);
  ncclResult_t res = ncclSuccess;
  int vr = r - first;
  if (vr == 0) {
    memcpy(&tab[first], &reply[1], a * (size_t)count);
    if (nids > 1) {
      int next_leader = block_first((k + 1) % nids, n, nids), prev_leader = block_first((k + nids - 1) % nids, n, nids);
      bs->peers[next_leader].addr = reply[0];
      for (int s = 0; s < nids - 1 && res == ncclSuccess; s++) {
        int sb = (k - s + nids) % nids, rb = (k - s - 1 + nids) % nids;
        int sf = block_first(sb, n, nids), sc = block_first(sb + 1, n, nids) - sf;
        int rf = block_first(rb, n, nids), rc = block_first(rb + 1, n, nids) - rf;
        res = send_locked(bs, next_leader, TAG_TABLE | (uint32_t)s, &tab[sf], a * (size_t)sc, &o);
        if (res == ncclSuccess) res = recv_locked(bs, prev_leader, TAG_TABLE | (uint32_t)s, &tab[rf], a * (size_t)rc, &o);
      }
    }
  } else {
    /* The table comes from the parent: vr less its lowest set bit. */
    int parent = first + (vr & (vr - 1));
    res = recv_locked(bs, parent, TAG_TABLE | 0xffffffu, tab, a * (size_t)n, &o);
  }
  if (res == ncclSuccess) {
    for (int i = 0; i < n; i++) bs->peers[i].addr = tab[i];
    /* Children: vr + 2^j for every 2^j below vr's lowest set bit (all of them for the leader). */
    int low = vr ? (vr & -vr) : 1;
    while (!vr && low < count) low <<= 1;
    for (int m = low >> 1; m > 0 && res == ncclSuccess; m >>= 1)
      if (vr + m < count) res = send_locked(bs, first + vr + m, TAG_TABLE | 0xffffffu, tab, a * (size_t)n, &o);
  }
  free(tab);
  return res;
}

ncclResult_t bootstrap_init(const ncclUniqueId* ids, int nids, int rank, int nranks, volatile uint32_t* abort_flag,
                            struct bootstrap** out) {
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
  if (!bs->peers || !bs->out_fd || !bs->in_closed || !bs->failed) {
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

  int64_t deadline = time_ms() + bs->timeout_ms;
  NCCLCHECKGOTO(checkin_send(bs, &id, nids, k, 0, deadline, &root_fd), res, fail);
  if (nids > 1 && rank == block_first(k, nranks, nids)) {
    int prev = (k + nids - 1) % nids, nfd;
    struct bootstrap_id pid;
    NCCLCHECKGOTO(bootstrap_id_decode(&ids[prev], &pid), res, fail);
    NCCLCHECKGOTO(checkin_send(bs, &pid, nids, prev, 1, deadline, &nfd), res, fail);
    close(nfd); /* the root reads it from the socket buffer; no reply */
  }
  /* The root's own deadline runs from the first check-in; allow it time to
   * tell us who is missing before we give up on it. */
  {
    int leader = rank == block_first(k, nranks, nids);
    int want = leader ? 1 + block_first(k + 1, nranks, nids) - block_first(k, nranks, nids) : 1;
    union sock_addr* reply = calloc((size_t)want, sizeof(*reply));
    if (!reply) {
      res = err_set(ncclSystemError, "out of memory in bootstrap");
      goto fail;
    }
    res = checkin_wait(bs, &id, root_fd, time_ms() + bs->timeout_ms + 3000, reply, want);
    close(root_fd);
    root_fd = -1;
    root_reap();
    bs->phase_ms[0] = (time_ns() - t0) / 1e6;
    if (res == ncclSuccess) res = spread_table(bs, k, nids, reply);
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
