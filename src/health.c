/* The keep-alive ring (the error record is comm_err.c). Every rank of a
 * communicator holds one TCP connection with each ring neighbour (rank-1 and
 * rank+1) and a watchdog thread that sends a small ping every period and
 * sleeps in poll() otherwise. A neighbour whose connection ends without a
 * goodbye (killed, crashed, aborted mid-work), or that stays silent for
 * COLLIE_PEER_TIMEOUT seconds (host down, link cut: no FIN, no RST), is
 * declared failed: the error is recorded on the communicator (every wait loop
 * checks it before it sleeps), the bootstrap stops waiting for that rank, and
 * a notice travels both ways around the ring so every survivor learns it
 * within the timeout, even ranks that never talk to the dead one.
 * A silent neighbour on this machine whose process is still there and not
 * stopped is waited for instead: the kernel reports its death (the connection
 * closes) and nothing can cut a link within one network stack, so its
 * silence means a machine too busy to run its keep-alive thread (hundreds of
 * ranks on two CPUs, a sanitizer's memory), not a failure.
 * Talks to init.c (started after the bootstrap, stopped by
 * destroy/abort) and bootstrap/ (address exchange, peer_failed marks). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "failures.h"
#include "procstat.h"

#define HMSG_MAGIC 0x484c4f43u  /* "COLH" */
#define HELLO_MAGIC 0x4f4c4548u /* "HELO" */

enum { HMSG_PING = 1, HMSG_BYE = 2, HMSG_DEAD = 3, HMSG_LEFT = 4 };
enum { WHY_CLOSED = 1, WHY_SILENT = 2, WHY_BROKEN = 3 };

/* Every message is 16 bytes, so a reader never has to resynchronise. */
struct hmsg {
  uint32_t magic;
  uint16_t type;
  uint16_t why;      /* HMSG_DEAD: WHY_* */
  int32_t rank;      /* HMSG_DEAD, HMSG_LEFT: the rank it is about */
  int32_t detector;  /* HMSG_DEAD: the rank that saw it first */
};
_Static_assert(sizeof(struct hmsg) == 16, "fixed-size keep-alive messages");

struct hello {
  uint32_t magic;
  int32_t rank;
  uint64_t comm_hash; /* from the unique ID's nonce: strangers cannot know it */
};

struct hlink {
  int fd;
  int peer;
  int gone;    /* failed or said goodbye: no longer watched */
  int local;   /* the link stays within this network stack (sock_link_local) */
  int waiting; /* silent past the timeout, waited for as a live local process */
  int64_t last_rx_ms;
  uint8_t buf[sizeof(struct hmsg)];
  size_t got;
};

struct health {
  struct ncclComm* comm;
  pthread_t thread;
  int wake_fd;
  int nlinks;
  struct hlink link[2];
  int64_t timeout_ms; /* 0: no silence detection (pings still go out) */
  int64_t period_ms;
  uint8_t* dead; /* by rank: known failed (written by the thread only) */
  uint8_t* left; /* by rank: said goodbye (atomic bytes: waiters read them) */
  int stop, goodbye; /* set before waking the thread to leave */
  int64_t mute_until_ms; /* health_mute: no pings before then */
  pid_t pid;             /* the process that owns the links (not a forked child) */
  struct health* next_live; /* live_list: rings of this process, for the exit goodbye */
};

/* Rings of this process that are running. A process that exits normally
 * (exit() or returning from main) without destroying its communicators says
 * goodbye on them from a library destructor, so its peers do not report it as
 * failed; a killed process cannot, and is reported. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct health* live_list;

static void live_add(struct health* h) {
  pthread_mutex_lock(&live_mu);
  h->next_live = live_list;
  live_list = h;
  pthread_mutex_unlock(&live_mu);
}

static void live_remove(struct health* h) {
  pthread_mutex_lock(&live_mu);
  for (struct health** p = &live_list; *p; p = &(*p)->next_live)
    if (*p == h) {
      *p = h->next_live;
      break;
    }
  pthread_mutex_unlock(&live_mu);
}

static void send_msg(struct hlink* l, int type, int why, int rank, int detector);

__attribute__((destructor)) static void health_exit_goodbye(void) {
  if (pthread_mutex_trylock(&live_mu) != 0) return; /* never block an exiting process */
  for (struct health* h = live_list; h; h = h->next_live)
    if (h->pid == getpid())
      for (int i = 0; i < h->nlinks; i++) send_msg(&h->link[i], HMSG_BYE, 0, 0, 0);
  pthread_mutex_unlock(&live_mu);
}

/* The error record (comm_set_error, comm_stop_check ...) lives in comm_err.c,
 * below the transports that also use it. */

/* ------------------------------------------------------------ processes */

/* The neighbour on link `l` went silent past the timeout: 1 if it is a live
 * process of this machine, reached within this network stack. */
static int peer_runs_here(struct health* h, const struct hlink* l) {
  struct ncclComm* comm = h->comm;
  return l->local && comm->machine[l->peer] == comm->machine[comm->rank] &&
         proc_running(comm->peers[l->peer].pid, comm->proc_start[l->peer]);
}

/* ------------------------------------------------------------ the thread */

static void send_msg(struct hlink* l, int type, int why, int rank, int detector) {
  if (l->gone || l->fd < 0) return;
  struct hmsg m = {HMSG_MAGIC, (uint16_t)type, (uint16_t)why, rank, detector};
  /* 16 bytes into a socket buffer of megabytes: only a peer that has not
   * read for a very long time fills it, and silence detection covers that. */
  (void)send(l->fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
}

static const char* why_str(int why, int64_t timeout_ms, char* buf, size_t n) {
  switch (why) {
    case WHY_CLOSED:
      return "its keep-alive connection closed without a goodbye (the process died, exited or aborted)";
    case WHY_SILENT:
      snprintf(buf, n, "no sign of life for %.1f s (COLLIE_PEER_TIMEOUT; host down or network cut?)",
               timeout_ms / 1000.0);
      return buf;
    default: return "its keep-alive connection failed";
  }
}

/* Rank `rank` failed: record it, stop the bootstrap waiting for it, and pass
 * the notice on (to every live neighbour except the one it came from). */
static void declare_dead(struct health* h, int rank, int why, int detector, int via) {
  struct ncclComm* comm = h->comm;
  if (rank < 0 || rank >= comm->nranks || rank == comm->rank || h->dead[rank]) return;
  h->dead[rank] = 1;
  bootstrap_peer_failed(comm->bs, rank);
  char wb[128], msg[400];
  const char* w = why_str(why, h->timeout_ms, wb, sizeof(wb));
  if (detector == comm->rank)
    snprintf(msg, sizeof(msg), "rank %d (%s) failed: %s; seen by rank %d", rank, comm->peers[rank].hostname, w,
             comm->rank);
  else
    snprintf(msg, sizeof(msg), "rank %d (%s) failed: %s; seen by rank %d, reported through rank %d", rank,
             comm->peers[rank].hostname, w, detector, via);
  /* Only the first failure is news; the rest (survivors leaving a broken
   * communicator without a goodbye) are logged quietly. */
  if (comm_set_error(comm, ncclRemoteError, msg)) WARN("comm %p rank %d: %s", (void*)comm, comm->rank, msg);
  else INFO(LOG_INIT, "comm %p rank %d: %s", (void*)comm, comm->rank, msg);
  /* Waiters sleeping on shared-memory counters notice now, not after their
   * sleep (sockets waiters wake on the dead peer's EOF or within 100 ms). */
  comm_wake_waiters(comm);
  for (int i = 0; i < h->nlinks; i++) {
    struct hlink* l = &h->link[i];
    if (l->peer == rank) l->gone = 1;
    else if (l->peer != via) send_msg(l, HMSG_DEAD, why, rank, detector);
  }
}

/* Rank `rank` left on purpose: not an error by itself, but shared-memory
 * waiters for it fail instead of waiting forever (it will never move its
 * counters again). Passed on like a failure notice. */
static void note_left(struct health* h, int rank, int via) {
  struct ncclComm* comm = h->comm;
  if (rank < 0 || rank >= comm->nranks || rank == comm->rank || h->dead[rank] ||
      __atomic_load_n(&h->left[rank], __ATOMIC_RELAXED))
    return;
  __atomic_store_n(&h->left[rank], 1, __ATOMIC_RELEASE);
  INFO(LOG_INIT, "rank %d: rank %d left the communicator", comm->rank, rank);
  transport_wake(comm);
  for (int i = 0; i < h->nlinks; i++) {
    struct hlink* l = &h->link[i];
    if (l->peer == rank) l->gone = 1;
    else if (l->peer != via) send_msg(l, HMSG_LEFT, 0, rank, rank);
  }
}

int health_peer_left(struct ncclComm* comm, int peer) {
  struct health* h = comm->health;
  return h && peer >= 0 && peer < comm->nranks && __atomic_load_n(&h->left[peer], __ATOMIC_ACQUIRE);
}

static void on_msg(struct health* h, struct hlink* l, const struct hmsg* m) {
  if (m->magic != HMSG_MAGIC) {
    declare_dead(h, l->peer, WHY_BROKEN, h->comm->rank, -1);
    return;
  }
  if (m->type == HMSG_BYE) {
    /* It leaves on purpose (destroy, or an abort with nothing running). */
    note_left(h, l->peer, l->peer);
    l->gone = 1;
  } else if (m->type == HMSG_LEFT) {
    note_left(h, m->rank, l->peer);
  } else if (m->type == HMSG_DEAD) {
    declare_dead(h, m->rank, m->why, m->detector, l->peer);
  }
}

static void read_link(struct health* h, struct hlink* l, int64_t now) {
  for (;;) {
    ssize_t rc = recv(l->fd, l->buf + l->got, sizeof(l->buf) - l->got, MSG_DONTWAIT);
    if (rc > 0) {
      if (l->waiting)
        INFO(LOG_INIT, "rank %d: rank %d is heard from again after %.1f s", h->comm->rank, l->peer,
             (now - l->last_rx_ms) / 1000.0);
      l->waiting = 0;
      l->last_rx_ms = now;
      l->got += (size_t)rc;
      if (l->got == sizeof(l->buf)) {
        struct hmsg m;
        memcpy(&m, l->buf, sizeof(m));
        l->got = 0;
        on_msg(h, l, &m);
        if (l->gone) return;
      }
      continue;
    }
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (rc < 0 && errno == EINTR) continue;
    declare_dead(h, l->peer, rc == 0 || errno == ECONNRESET ? WHY_CLOSED : WHY_BROKEN, h->comm->rank, -1);
    l->gone = 1;
    return;
  }
}

static void* health_main(void* p) {
  struct health* h = p;
  log_set_rank(h->comm->rank);
  int64_t next_ping = 0;
  for (;;) {
    int64_t now = time_ms();
    if (__atomic_load_n(&h->stop, __ATOMIC_ACQUIRE)) break;
    /* Pings go out even with our own silence check off: a peer may have it on. */
    if (now >= next_ping) {
      if (now >= __atomic_load_n(&h->mute_until_ms, __ATOMIC_RELAXED))
        for (int i = 0; i < h->nlinks; i++) send_msg(&h->link[i], HMSG_PING, 0, 0, 0);
      next_ping = now + h->period_ms;
    }
    int64_t wait = next_ping - now;
    struct pollfd pf[3];
    int idx[3], n = 0;
    pf[n] = (struct pollfd){.fd = h->wake_fd, .events = POLLIN};
    idx[n++] = -1;
    for (int i = 0; i < h->nlinks; i++) {
      struct hlink* l = &h->link[i];
      if (l->gone) continue;
      if (h->timeout_ms > 0) {
        int64_t left = l->last_rx_ms + h->timeout_ms - now;
        if (left <= 0) {
          /* This thread may itself have waited long for a CPU: what the
           * neighbour sent meanwhile counts first. */
          read_link(h, l, now);
          if (l->gone) continue;
          left = l->last_rx_ms + h->timeout_ms - now;
        }
        if (left <= 0 && peer_runs_here(h, l)) {
          if (!l->waiting)
            INFO(LOG_INIT, "rank %d: rank %d silent for %.1f s, but its process runs on this machine: waiting for it",
                 h->comm->rank, l->peer, (now - l->last_rx_ms) / 1000.0);
          l->waiting = 1;
          left = h->period_ms; /* look again then */
        } else if (left <= 0) {
          declare_dead(h, l->peer, WHY_SILENT, h->comm->rank, -1);
          l->gone = 1;
          continue;
        }
        if (left < wait) wait = left;
      }
      pf[n] = (struct pollfd){.fd = l->fd, .events = POLLIN};
      idx[n++] = i;
    }
    if (wait < 1) wait = 1;
    int rc = poll(pf, (nfds_t)n, (int)wait);
    if (rc <= 0) continue;
    now = time_ms();
    for (int k = 0; k < n; k++) {
      if (!pf[k].revents) continue;
      if (idx[k] < 0) {
        uint64_t v;
        (void)!read(h->wake_fd, &v, sizeof(v));
        continue;
      }
      struct hlink* l = &h->link[idx[k]];
      if (!l->gone) read_link(h, l, now);
    }
  }
  if (h->goodbye)
    for (int i = 0; i < h->nlinks; i++) send_msg(&h->link[i], HMSG_BYE, 0, 0, 0);
  return NULL;
}

/* ------------------------------------------------------------ setup */

static void health_free(struct health* h) {
  for (int i = 0; i < 2; i++)
    if (h->link[i].fd >= 0) close(h->link[i].fd);
  if (h->wake_fd >= 0) close(h->wake_fd);
  free(h->dead);
  free(h->left);
  free(h);
}

/* Accepts the connection of rank `want` (its hello must carry our comm hash),
 * dropping strangers. */
static ncclResult_t accept_from(struct ncclComm* comm, int lfd, int want, int64_t deadline, int* out) {
  for (;;) {
    union sock_addr from;
    int fd;
    int st = sock_accept(lfd, &fd, &from);
    if (st == SOCK_OK) {
      struct hello hi;
      int64_t hs = time_ms() + 5000;
      if (sock_recv_all(fd, &hi, sizeof(hi), hs < deadline ? hs : deadline, &comm->abort_flag) == SOCK_OK &&
          hi.magic == HELLO_MAGIC && hi.rank == want && hi.comm_hash == comm->comm_hash) {
        *out = fd;
        return ncclSuccess;
      }
      bootstrap_note_dropped(&from, "keep-alive listener", "bad hello");
      close(fd);
      continue;
    }
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_RELAXED))
      return err_set(ncclSystemError, "rank %d: init aborted while connecting the keep-alive ring", comm->rank);
    if (time_ms() > deadline)
      return err_set(ncclRemoteError, "rank %d: rank %d (%s) never opened its keep-alive connection", comm->rank,
                     want, comm->peers[want].hostname);
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    poll(&p, 1, 100);
  }
}

ncclResult_t health_listen(const union sock_addr* near, int listen_any, int* fd, union sock_addr* addr) {
  *addr = *near;
  if (addr->sa.sa_family == AF_INET) addr->sin.sin_port = 0;
  else addr->sin6.sin6_port = 0;
  return sock_listen_on(addr, listen_any, fd);
}

ncclResult_t health_init(struct ncclComm* comm, int lfd, const union sock_addr* prev_addr) {
  int n = comm->nranks, r = comm->rank;
  if (n < 2) {
    if (lfd >= 0) close(lfd);
    return ncclSuccess;
  }
  struct health* h = calloc(1, sizeof(*h));
  if (!h) {
    close(lfd);
    return err_set(ncclSystemError, "out of memory for the keep-alive ring");
  }
  h->comm = comm;
  h->wake_fd = -1;
  h->link[0].fd = h->link[1].fd = -1;
  ncclResult_t res = ncclSuccess;
  h->dead = calloc((size_t)n, 1);
  h->left = calloc((size_t)n, 1);
  if (!h->dead || !h->left) {
    res = err_set(ncclSystemError, "out of memory for the keep-alive ring");
    goto fail;
  }
  h->timeout_ms = param_int(P_COLLIE_PEER_TIMEOUT, 0, 86400) * 1000;
  /* About four pings per timeout, at most one a second: negligible traffic
   * and wake-ups even with many ranks on few cores. */
  h->period_ms = h->timeout_ms > 0 ? COLLIE_MAX(COLLIE_MIN(h->timeout_ms / 4, 1000), 50) : 1000;
  int prev = (r + n - 1) % n, next = (r + 1) % n;
  /* The predecessor's listener has been open since before its check-in (its
   * address came in its bootstrap card), so this connect never waits for it. */
  union sock_addr paddr = *prev_addr;
  int64_t deadline = time_ms() + param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  /* Everyone dials its predecessor first (the listen backlog completes the
   * connection), then accepts its successor's: no rank waits on another. */
  int st = sock_connect(&paddr, deadline, &comm->abort_flag, &h->link[0].fd);
  if (st != SOCK_OK) {
    res = err_set(st == SOCK_ABORTED ? ncclSystemError : ncclRemoteError,
                  "rank %d: cannot open the keep-alive connection to rank %d (%s): %s", r, prev,
                  comm->peers[prev].hostname, sock_status_str(st));
    goto fail;
  }
  h->link[0].peer = prev;
  struct hello hi = {HELLO_MAGIC, r, comm->comm_hash};
  if (sock_send_all(h->link[0].fd, &hi, sizeof(hi), deadline, &comm->abort_flag) != SOCK_OK) {
    res = err_set(ncclRemoteError, "rank %d: keep-alive handshake with rank %d (%s) failed", r, prev,
                  comm->peers[prev].hostname);
    goto fail;
  }
  NCCLCHECKGOTO(accept_from(comm, lfd, next, deadline, &h->link[1].fd), res, fail);
  h->link[1].peer = next;
  close(lfd);
  lfd = -1;
  h->nlinks = 2;
  for (int i = 0; i < 2; i++) h->link[i].local = sock_link_local(h->link[i].fd);
  int64_t now = time_ms();
  h->link[0].last_rx_ms = h->link[1].last_rx_ms = now;
  h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (h->wake_fd < 0) {
    res = err_set(ncclSystemError, "eventfd failed: %s", strerror(errno));
    goto fail;
  }
  int rc = pthread_create(&h->thread, NULL, health_main, h);
  if (rc != 0) {
    res = err_set(ncclSystemError, "cannot start the keep-alive thread: %s", strerror(rc));
    goto fail;
  }
  h->pid = getpid();
  comm->health = h;
  live_add(h);
  INFO(LOG_INIT, "rank %d: keep-alive ring with ranks %d and %d, timeout %lld ms, ping every %lld ms", r, prev, next,
       (long long)h->timeout_ms, (long long)h->period_ms);
  return ncclSuccess;
fail:
  if (lfd >= 0) close(lfd);
  health_free(h);
  return res;
}

void health_mute(struct ncclComm* comm, int64_t ms) {
  struct health* h = comm->health;
  if (h) __atomic_store_n(&h->mute_until_ms, time_ms() + ms, __ATOMIC_RELAXED);
}

void comm_wake_waiters(struct ncclComm* comm) {
  /* The fd first: a socket or bootstrap waiter that checked the flags before
   * they were set then wakes from poll() at once. */
  uint64_t one = 1;
  if (comm->stop_fd >= 0) (void)!write(comm->stop_fd, &one, sizeof(one));
  transport_wake(comm);
}

void health_stop(struct ncclComm* comm, int goodbye) {
  struct health* h = comm->health;
  if (!h) return;
  comm->health = NULL;
  live_remove(h);
  h->goodbye = goodbye;
  __atomic_store_n(&h->stop, 1, __ATOMIC_RELEASE);
  uint64_t one = 1;
  (void)!write(h->wake_fd, &one, sizeof(one));
  pthread_join(h->thread, NULL);
  health_free(h);
}
