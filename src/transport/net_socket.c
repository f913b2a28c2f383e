/* Socket (TCP) connectors, for ranks on different hosts or when shared
 * memory is off. Each side keeps its own ring of slots in local memory; the
 * bytes of a committed slot (header + payload) are written to the socket by
 * progress(), and the receiver's progress() reads them into its free slots.
 * TCP provides the flow control. Everything is nonblocking: progress is made
 * by whoever waits (transport_wait polls every socket of the communicator). */
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../bootstrap/socket.h"
#include "../comm.h"
#include "transport.h"

struct sock_conn {
  int fd;
  int listen_fd; /* receiver, until the sender connected */
  char* slots;
  struct slot_hdr* hdrs;
  uint32_t pos;  /* sender: slots committed; receiver: slots consumed */
  uint32_t done; /* sender: slots fully written; receiver: slots fully read */
  size_t off;    /* bytes of the current slot (header first) moved so far */
  int failed;    /* the link broke or the peer poisoned it */
};

struct sock_hello {
  uint64_t comm_hash;
  int32_t rank;
  int32_t pad;
};

int sock_conn_fd(struct conn* c); /* for transport_wait */
int sock_conn_fd(struct conn* c) { return ((struct sock_conn*)c->priv)->fd; }

static char* slot_data(struct conn* c, uint32_t i) {
  struct sock_conn* s = c->priv;
  return s->slots + (size_t)(i % (uint32_t)c->nslots) * c->slot_bytes;
}

/* Moves the current slot's header then payload; returns bytes of this slot. */
static size_t slot_len(const struct slot_hdr* h) {
  return sizeof(*h) + ((h->flags & SLOT_ERROR) ? 0 : h->bytes);
}

static ncclResult_t sock_progress_send(struct conn* c) {
  struct sock_conn* s = c->priv;
  while (s->done != s->pos) {
    struct slot_hdr* h = &s->hdrs[s->done % (uint32_t)c->nslots];
    size_t len = slot_len(h);
    while (s->off < len) {
      const char* p = s->off < sizeof(*h) ? (const char*)h + s->off : slot_data(c, s->done) + (s->off - sizeof(*h));
      size_t n = s->off < sizeof(*h) ? sizeof(*h) - s->off : len - s->off;
      ssize_t rc = send(s->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (rc > 0) {
        s->off += (size_t)rc;
        continue;
      }
      if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      s->failed = 1;
      return err_set(ncclRemoteError, "socket: rank %d lost its connection to rank %d (%s): %s", c->comm->rank,
                     c->peer, bootstrap_peer_host(c->comm->bs, c->peer), rc == 0 ? "closed" : strerror(errno));
    }
    s->off = 0;
    s->done++;
  }
  return ncclSuccess;
}

static ncclResult_t sock_progress_recv(struct conn* c) {
  struct sock_conn* s = c->priv;
  while ((uint32_t)(s->done - s->pos) < (uint32_t)c->nslots && !s->failed) {
    struct slot_hdr* h = &s->hdrs[s->done % (uint32_t)c->nslots];
    size_t need = s->off < sizeof(*h) ? sizeof(*h) : slot_len(h);
    while (s->off < need) {
      char* p = s->off < sizeof(*h) ? (char*)h + s->off : slot_data(c, s->done) + (s->off - sizeof(*h));
      size_t n = need - s->off;
      ssize_t rc = recv(s->fd, p, n, MSG_DONTWAIT);
      if (rc > 0) {
        s->off += (size_t)rc;
        if (s->off == sizeof(*h)) {
          if (!(h->flags & SLOT_ERROR) && h->bytes > c->slot_bytes) {
            s->failed = 1;
            return err_set(ncclRemoteError, "socket: rank %d sent a %u-byte slot (max %zu): corrupt stream", c->peer,
                           h->bytes, c->slot_bytes);
          }
          need = slot_len(h);
        }
        continue;
      }
      if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclSuccess;
      s->failed = 1;
      /* A close between slots is how a peer that finished (and destroyed its
       * communicator) says goodbye: what it sent is still ours to consume. A
       * waiter that needs more than that sees peer_failed. */
      if (rc == 0 && s->off == 0) return ncclSuccess;
      return err_set(ncclRemoteError, "socket: rank %d (%s) closed its connection to rank %d%s%s", c->peer,
                     bootstrap_peer_host(c->comm->bs, c->peer), c->comm->rank, rc == 0 ? "" : ": ",
                     rc == 0 ? "" : strerror(errno));
    }
    s->off = 0;
    s->done++;
  }
  return ncclSuccess;
}

static ncclResult_t sock_progress(struct conn* c) {
  return c->is_send ? sock_progress_send(c) : sock_progress_recv(c);
}

static void* sock_send_slot(struct conn* c) {
  struct sock_conn* s = c->priv;
  if ((uint32_t)(s->pos - s->done) >= (uint32_t)c->nslots) return NULL;
  return slot_data(c, s->pos);
}

static ncclResult_t sock_send_commit(struct conn* c, const struct slot_hdr* h) {
  struct sock_conn* s = c->priv;
  s->hdrs[s->pos % (uint32_t)c->nslots] = *h;
  s->pos++;
  return sock_progress_send(c);
}

static const void* sock_recv_slot(struct conn* c, struct slot_hdr* h) {
  struct sock_conn* s = c->priv;
  if (s->done == s->pos) return NULL;
  *h = s->hdrs[s->pos % (uint32_t)c->nslots];
  return slot_data(c, s->pos);
}

static ncclResult_t sock_recv_release(struct conn* c) {
  struct sock_conn* s = c->priv;
  s->pos++;
  return sock_progress_recv(c);
}

static void sock_wait(struct conn* c, int timeout_ms) {
  struct sock_conn* s = c->priv;
  struct pollfd p = {.fd = s->fd, .events = c->is_send ? POLLOUT : POLLIN};
  poll(&p, 1, timeout_ms);
}

static void sock_fail(struct conn* c) {
  struct sock_conn* s = c->priv;
  if (!s || s->fd < 0) return;
  /* Closing the write side is the poison: the peer reads EOF. */
  shutdown(s->fd, SHUT_RDWR);
  s->failed = 1;
}

static int sock_peer_failed(struct conn* c) { return ((struct sock_conn*)c->priv)->failed; }

static void sock_close(struct conn* c) {
  struct sock_conn* s = c->priv;
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  if (s->listen_fd >= 0) close(s->listen_fd);
  free(s->slots);
  free(s->hdrs);
  free(s);
  c->priv = NULL;
}

static int sock_pending(struct conn* c) {
  struct sock_conn* s = c->priv;
  return c->is_send && s->done != s->pos;
}

static const struct conn_ops sock_ops = {sock_send_slot, sock_send_commit, sock_recv_slot, sock_recv_release,
                                         sock_progress,  sock_wait,        sock_fail,      sock_pending,
                                         sock_peer_failed, sock_close};

static ncclResult_t sock_alloc(struct conn* c) {
  struct sock_conn* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "socket transport: out of memory");
  s->fd = s->listen_fd = -1;
  c->priv = s;
  c->ops = &sock_ops;
  s->slots = malloc((size_t)c->nslots * c->slot_bytes);
  s->hdrs = calloc((size_t)c->nslots, sizeof(*s->hdrs));
  if (!s->slots || !s->hdrs) return err_set(ncclSystemError, "socket transport: out of memory for slots");
  return ncclSuccess;
}

ncclResult_t sock_recv_setup(struct conn* c, void* info, size_t* info_len) {
  NCCLCHECK(sock_alloc(c));
  struct sock_conn* s = c->priv;
  union sock_addr addr = *bootstrap_peer_addr(c->comm->bs, c->comm->rank);
  if (addr.sa.sa_family == AF_INET) addr.sin.sin_port = 0;
  else addr.sin6.sin6_port = 0;
  NCCLCHECK(sock_listen(&addr, &s->listen_fd));
  memcpy(info, &addr, sizeof(addr));
  *info_len = sizeof(addr);
  return ncclSuccess;
}

ncclResult_t sock_send_connect(struct conn* c, const void* info, size_t info_len) {
  NCCLCHECK(sock_alloc(c));
  struct sock_conn* s = c->priv;
  union sock_addr addr;
  if (info_len != sizeof(addr)) return err_set(ncclInternalError, "socket: bad connection info from rank %d", c->peer);
  memcpy(&addr, info, sizeof(addr));
  int64_t deadline = time_ms() + param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  int st = sock_connect(&addr, deadline, &c->comm->abort_flag, &s->fd);
  if (st != SOCK_OK)
    return err_set(ncclRemoteError, "socket: rank %d cannot connect to rank %d (%s): %s", c->comm->rank, c->peer,
                   bootstrap_peer_host(c->comm->bs, c->peer), sock_status_str(st));
  struct sock_hello hello = {c->comm->comm_hash, c->comm->rank, 0};
  if (sock_send_all(s->fd, &hello, sizeof(hello), deadline, &c->comm->abort_flag) != SOCK_OK)
    return err_set(ncclRemoteError, "socket: rank %d: handshake with rank %d failed", c->comm->rank, c->peer);
  int sz = 4 << 20;
  setsockopt(s->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  return ncclSuccess;
}

ncclResult_t sock_recv_connected(struct conn* c) {
  struct sock_conn* s = c->priv;
  int64_t deadline = time_ms() + param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  while (s->fd < 0) {
    union sock_addr from;
    int fd;
    int st = sock_accept(s->listen_fd, &fd, &from);
    if (st == SOCK_OK) {
      struct sock_hello hello;
      if (sock_recv_all(fd, &hello, sizeof(hello), time_ms() + 5000, &c->comm->abort_flag) == SOCK_OK &&
          hello.comm_hash == c->comm->comm_hash && hello.rank == c->peer) {
        s->fd = fd;
        break;
      }
      bootstrap_note_dropped(&from, "socket transport", "bad handshake");
      close(fd);
      continue;
    }
    if (time_ms() > deadline)
      return err_set(ncclRemoteError, "socket: rank %d waited in vain for rank %d to connect", c->comm->rank, c->peer);
    struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
    poll(&p, 1, 100);
  }
  close(s->listen_fd);
  s->listen_fd = -1;
  int sz = 4 << 20;
  setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
  return ncclSuccess;
}
